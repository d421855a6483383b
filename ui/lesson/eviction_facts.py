"""The eviction chapter ("What the cache forgets"): its numbers, read from the arrays the eviction view draws
(`ui.views.eviction_shown`), and the variant its run calls for."""

from __future__ import annotations

import numpy as np

from engine.errors import InvalidSettingError
from ui.text.strings import Shown
from ui.views.context import ViewContext
from ui.views.eviction_shown import EvictionShown, check, kept_counts, policy_label, shown_eviction
from viz.eviction import OUTSIDE_WINDOW

STRONG_SINK = 0.2  # the question about the sink asks why so much: a layer must put at least this on position 0


def facts(ctx: ViewContext) -> dict:
    """The chapter's numbers at the page's step; {} where the settings cannot run (the view says why)."""
    if check(ctx):
        return {}
    try:
        data = shown_eviction(ctx)
    except InvalidSettingError:
        return {}
    info, record = ctx.info, data.evicting
    low, high = kept_counts(data, info)
    share = data.share_by_layer()
    sink_full, sink_kept = data.sink(data.full), data.sink(data.evicting)
    share_layer, sink_layer = int(np.argmax(share)), int(np.argmax(sink_full))
    kinds = info.layer_kinds
    out = dict(
        ev_policy=policy_label(ctx, data.settings),
        ev_token=data.passes,
        ev_length=record.position + 1,
        ev_context=len(ctx.runner.prompt_ids) - 1,
        ev_kept=Shown(f"{low:,}" if low == high else f"{low:,}–{high:,}"),
        ev_share_pct=100 * float(share[share_layer]),
        ev_share_layer=share_layer,
        ev_sink_pct=100 * float(sink_full[sink_layer]),
        ev_sink_layer=sink_layer,
        ev_sink_kept_pct=100 * float(sink_kept[sink_layer]),
        ev_strong_sink=bool(sink_full[sink_layer] >= STRONG_SINK),
        ev_kept_kib=record.kept_bytes / 1024,
        ev_alloc_kib=record.allocated_bytes / 1024,
        ev_full_kib=record.full_bytes / 1024,
        ev_text_note=text_note(ctx, data),
    )
    out["ev_grey"] = ctx.t("lesson_evict_grey") if (record.kept == OUTSIDE_WINDOW).any() else ""
    if info.sliding_window is None:
        out["ev_window_note"] = ctx.t("lesson_evict_no_window", name=info.name, layers=info.layers)
    else:
        local = [i for i, k in enumerate(kinds) if k == "local"]
        first = record.position + 1 - info.cached_positions(local[0], record.position + 1)
        out["ev_window_note"] = ctx.t(
            "lesson_evict_window" if first else "lesson_evict_window_inside",
            local=len(local),
            layers=info.layers,
            w=info.sliding_window,
            first=first,
            global_=kinds.count("global"),
        )
    return out


def text_note(ctx: ViewContext, data: EvictionShown) -> str:
    """Whether the policy's answer parted from the full cache's, and what it cost the prediction there
    (`EvictionShown.cost`)."""
    token, kl, same = data.cost()
    if same:
        return ctx.t("lesson_evict_same", n=data.passes, kl=f"{kl:.3g}")
    return ctx.t("lesson_evict_differs", token=token, kl=f"{kl:.3g}")


def variants(f: dict) -> tuple[str | None, ...]:
    """Its question asks why a layer looks so much at position 0 only where one does."""
    return (None if f.get("ev_strong_sink", True) else "weak_sink",)
