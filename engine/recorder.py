"""What a forward pass keeps for the trace, collected beside the layers rather than woven into them.

Each `DecoderLayer` hands its attention result and its residual stream to a `StepRecorder`; the
recorder keeps what `Capture` asked for, in buffers sized for it (one copy per layer, no extra sync),
and builds the pass's `ForwardRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionResult, SplitRecord
from engine.trace import Capture, SplitKVTrace


@dataclass
class ForwardRecord:
    """What one forward pass returns: logits for the last position and what `Capture` asked for."""

    logits: torch.Tensor  # (vocab,) float32
    final_hidden: torch.Tensor  # (hidden,) after the final norm
    attention: torch.Tensor | None  # (layers, q_heads, rows, L)
    scores: torch.Tensor | None
    attention_rows: list[int]
    residual: torch.Tensor | None  # (layers, 3, hidden) at the last position
    split: SplitKVTrace | None


class StepRecorder:
    """Collects one pass's trace tensors as the layers run.

    Attention is kept for `capture.layers` (all when None), for the last `rows` query positions that fit
    the capture budget; residuals are x0, x1, x2 of the last position in every layer.
    """

    def __init__(
        self,
        capture: Capture,
        positions: list[int],
        layers: int,
        q_heads: int,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        length = positions[-1] + 1
        self.positions = positions
        self.rows = _attention_rows(len(positions), length, layers, q_heads, capture)
        recorded = range(layers) if capture.layers is None else capture.layers
        self.slot_of = {layer: i for i, layer in enumerate(recorded)} if capture.attention else {}
        # (recorded layers, q_heads, rows, L) each: filled in place, one copy per layer
        self.probs = torch.empty((len(self.slot_of), q_heads, self.rows, length), dtype=dtype, device=device)
        self.scores = torch.empty_like(self.probs)
        # (layers, 3, hidden): x0, x1, x2 of the last position
        self.residual = torch.empty((layers, 3, hidden), dtype=dtype, device=device) if capture.residuals else None
        self.splits: list[SplitRecord] = []

    def attention(self, layer: int, result: AttentionResult) -> None:
        """Keep layer `layer`'s probabilities and scores (its last `rows` rows) and its split-KV record."""
        if layer in self.slot_of:
            self.probs[self.slot_of[layer]] = result.probs[:, -self.rows :]
            self.scores[self.slot_of[layer]] = result.scores[:, -self.rows :]
        if result.split is not None:
            self.splits.append(result.split)

    def residuals(self, layer: int, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> None:
        """x0, x1, x2 (T, hidden): the stream into the layer, after attention, after the MLP; the last row kept."""
        if self.residual is not None:
            torch.stack((x0[-1], x1[-1], x2[-1]), out=self.residual[layer])

    def finish(self, logits: torch.Tensor, final_hidden: torch.Tensor) -> ForwardRecord:
        """The pass's record, on the CPU."""
        kept = bool(self.slot_of)
        return ForwardRecord(
            logits=logits.cpu(),
            final_hidden=final_hidden.cpu(),
            attention=self.probs.cpu() if kept else None,
            scores=self.scores.cpu() if kept else None,
            attention_rows=self.positions[-self.rows :] if kept else [],
            residual=self.residual.cpu() if self.residual is not None else None,
            split=_stack_splits(self.splits) if self.splits else None,
        )


def _attention_rows(t: int, length: int, layers: int, q_heads: int, capture: Capture) -> int:
    """How many of the last of `t` query rows fit in the capture budget (at least one)."""
    recorded = layers if capture.layers is None else len(capture.layers)
    per_row = max(1, recorded) * q_heads * length
    return max(1, min(t, capture.attention_budget // per_row))


def _stack_splits(records: list[SplitRecord]) -> SplitKVTrace:
    """Per-layer split records → one trace with a leading layers axis."""

    def stack(get):
        return torch.stack([get(r) for r in records]).cpu()

    return SplitKVTrace(
        ranges=records[0].ranges,
        max_score=stack(lambda r: r.partials.max_score),
        exp_sum=stack(lambda r: r.partials.exp_sum),
        partial=stack(lambda r: r.partials.output),
        weight=stack(lambda r: r.merged.weight),
        merged=stack(lambda r: r.merged.output),
        unsplit=stack(lambda r: r.unsplit),
    )
