"""What an eviction run keeps of its passes (`EvictionStep`) and of each layer's evictions (`Eviction`): plain data
the views and the lesson read."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Eviction:
    """One layer's eviction: its rows before (positions, (kv_heads, n)), their scores, and the rows kept."""

    positions: torch.Tensor  # (kv_heads, n) long
    scores: torch.Tensor | None  # (kv_heads, n) float; None for the streaming window (it keeps by position)
    kept_rows: torch.Tensor  # (kv_heads, n_kept) long, indices into the rows, in the cache's new order
    held: torch.Tensor | None = None  # AdaKV: (kv_heads, n) bool, the rows each head reads (kept_rows: all of them)

    @property
    def kept_positions(self) -> torch.Tensor:
        """(kv_heads, n_kept) the positions kept, ascending (every head keeps as many: not AdaKV's)."""
        return self.positions.gather(1, self.kept_rows).sort(dim=1).values


@dataclass
class EvictionStep:
    """One pass over the evicted cache: the last prompt token (step 0) or one answer token."""

    step: int
    position: int
    input_id: int
    token_id: int  # greedy: the argmax of the logits
    # Dropped (None) once the step is older than the run's `keep_full_steps`, so a long run's memory stays bounded:
    kept: list[torch.Tensor | None] | None  # per layer: (kv_heads, position + 1) bool, what this pass's attention read
    logits: torch.Tensor | None  # (vocab,) float32
    attention: torch.Tensor | None  # (layers, q_heads, position + 1): the probabilities it used (0 where evicted)
    evicted_share: torch.Tensor  # (layers, q_heads): the share full attention puts on the positions `kept` hid
    evictions: list[Eviction | None]  # per layer: what was evicted after this pass (None: nothing)
    final_hidden: torch.Tensor | None = None  # (hidden,) the final norm's output: the logits are lm_head's of it
