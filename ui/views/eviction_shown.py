"""What the eviction view and its lesson chapter show at the page's step: the pair of runs (`ui.runs.eviction`) for
the link's settings, advanced to the step, and the numbers both read from it, so the chapter's text quotes the very
arrays the figures draw. Also the page-language message for settings that cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from engine.errors import InvalidSettingError
from engine.eviction.policies import PREFILL_ONLY
from ui.runs.eviction import EvictionLabFull, EvictionPair, EvictionTooLarge, PassRecord, first_difference
from ui.runs.eviction_settings import N_SINK, EvictionSettings
from ui.views.context import ViewContext
from viz.eviction import EVICTED, KEPT


@dataclass
class EvictionShown:
    settings: EvictionSettings
    pair: EvictionPair
    passes: int  # answer tokens both runs have made, up to the page's step

    @property
    def full(self) -> PassRecord:
        return self.pair.full.passes[self.passes - 1]

    @property
    def evicting(self) -> PassRecord:
        return self.pair.evicting.passes[self.passes - 1]

    @property
    def capped(self) -> bool:
        return self.pair.plan.steps < self.pair.plan.wanted

    def sink(self, record: PassRecord) -> np.ndarray:
        """(layers,) the attention on position 0, averaged over each layer's Q heads: the sink figure's bars."""
        return record.sink_share.mean(axis=1)

    def share_by_layer(self) -> np.ndarray:
        """(layers,) the share full attention puts on what the policy hid, averaged over each layer's Q heads."""
        return self.evicting.evicted_share.mean(axis=1)

    def history(self, layer: int, kv_head: int) -> np.ndarray:
        """(passes, L) the states of one (layer, KV head) at each pass so far, NaN where a position did not exist."""
        length = self.evicting.position + 1
        out = np.full((self.passes, length), np.nan)
        for i, record in enumerate(self.pair.evicting.passes[: self.passes]):
            out[i, : record.position + 1] = record.kept[layer, kv_head]
        return out

    @cached_property
    def difference(self) -> int | None:
        """The first answer token (0-based) where the two runs part, None while they agree."""
        return first_difference(self.token_ids(self.pair.full), self.token_ids(self.pair.evicting))

    def costs(self) -> dict[str, list[float | None]]:
        """Each policy's run of the lab (the streaming window's alone at that timing): its KL from the full cache
        at each answer token up to the page's (None once its text parted), by run name."""
        runs = list(self.pair.lab.runs.items())  # a copy: another page's policy may join meanwhile
        return {name: [p.kl for p in run.passes[: self.passes]] for name, run in runs if name is not None}

    def cost(self) -> tuple[int, float, bool]:
        """What evicting cost the policy's prediction, where the two runs still predict after the same text: (the
        answer token, 1-based, its next-token KL from the full cache's, whether the policy's token there is the
        full cache's too). The page's token while the texts agree so far, else the token where they parted."""
        last = max(i for i, p in enumerate(self.pair.evicting.passes[: self.passes]) if p.kl is not None)
        ours, theirs = self.pair.evicting.passes[last], self.pair.full.passes[last]
        return last + 1, ours.kl, ours.token_id == theirs.token_id

    def token_ids(self, run) -> list[int]:
        return [p.token_id for p in run.passes[: self.passes]]

    def texts(self) -> tuple[str, str, str]:
        """The shared start, then the full cache's rest and the policy's (both "" while they agree)."""
        cut = self.passes if self.difference is None else self.difference
        pieces = lambda run: [p.piece for p in run.passes[: self.passes]]  # noqa: E731
        full, evicting = pieces(self.pair.full), pieces(self.pair.evicting)
        return "".join(full[:cut]), "".join(full[cut:]), "".join(evicting[cut:])


def shown_eviction(ctx: ViewContext, progress: Callable[[int], None] | None = None) -> EvictionShown:
    """The pair for the page's settings, advanced to its step (raises InvalidSettingError where they cannot run);
    `progress(passes)` is told as the lab catches up."""
    settings = EvictionSettings.of(ctx.state)
    pair, passes = ctx.runner.eviction_pair(settings, ctx.step, progress)
    return EvictionShown(settings, pair, passes)


def check(ctx: ViewContext) -> str | None:
    """Why the link's eviction settings cannot run on this prompt, in the page's language (None: they can)."""
    state, n = ctx.state, len(ctx.runner.prompt_ids)
    if n < 2:
        return ctx.t("evict_short_prompt", n=n)
    if state.evict_at == "prefill" and state.evict == "streaming_llm" and n - 1 <= 4:
        return ctx.t("evict_too_few_for_sinks", n=n - 1)
    if state.evict_at == "decode" and state.evict in PREFILL_ONLY:
        return ctx.t("evict_prefill_only", policy=ctx.t("evict_short_" + state.evict))
    if state.evict_at == "decode" and state.evict == "snapkv" and state.interval < 2:
        return ctx.t("evict_snapkv_interval")
    if state.evict_at == "decode" and state.evict == "expected_attention" and state.interval <= N_SINK:
        return ctx.t("evict_expected_interval", sinks=N_SINK, least=N_SINK + 1)
    return None


def error_message(ctx: ViewContext, error: InvalidSettingError) -> str:
    if isinstance(error, EvictionLabFull):
        return ctx.t("evict_lab_full", policies=", ".join(str(ctx.t("evict_short_" + n)) for n in error.names))
    if isinstance(error, EvictionTooLarge):
        return ctx.t("evict_too_large", need=error.plan.estimated_bytes / 10**6, mb=ctx.runner.step_memory_mb)
    return ctx.t("evict_cannot_run", error=str(error))


def kept_counts(shown: EvictionShown, info) -> tuple[int, int]:
    """(fewest, most) positions a global (layer, KV head), the ones eviction applies to, read at the shown pass."""
    kept = shown.evicting.kept
    counts = [(kept[layer] == KEPT).sum(axis=-1) for layer in range(info.layers) if info.window(layer) is None]
    return int(min(c.min() for c in counts)), int(max(c.max() for c in counts))


def evicted_anywhere(shown: EvictionShown) -> int:
    """Positions some (layer, KV head) does not read at the shown pass (evicted, not outside a window)."""
    return int((shown.evicting.kept == EVICTED).any(axis=(0, 1)).sum())


def policy_label(ctx: ViewContext, s: EvictionSettings) -> str:
    """The settings in words: "SnapKV (…), 50% evicted after the prefill"."""
    if s.at == "stream":
        return ctx.t("evict_label_stream", window=s.window)
    name = ctx.t("evict_policy_" + s.policy)
    if s.at == "prefill":
        return ctx.t("evict_label_prefill", policy=name, percent=round(100 * s.ratio))
    return ctx.t("evict_label_decode", policy=name, budget=s.budget, interval=s.interval)
