"""Prefix caching: the new prompt aligned with the closest cached one, and reuse under each policy."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.prefix_cache import PolicyReuse
from viz.style import (
    HIT_COLOR,
    MISS_COLOR,
    MOST_LABELLED,
    check_mark,
    finish,
    fmt_int,
    readable,
    text_color_on,
    tick_step,
)
from viz.words import ENGLISH, Words


def alignment_frame(
    cached: list[int], new: list[int], cached_labels: list[str], new_labels: list[str], reused: int
) -> pd.DataFrame:
    """Position by position: cached id, new id, equal or not, and whether the new prompt reused it."""
    rows = []
    for p in range(max(len(cached), len(new))):
        old = cached[p] if p < len(cached) else None
        now = new[p] if p < len(new) else None
        rows.append(
            {
                "position": p,
                "cached token": cached_labels[p] if old is not None else "",
                "cached id": old,
                "new id": now,
                "new token": new_labels[p] if now is not None else "",
                "same id": old is not None and old == now,
                "reused": p < reused,
            }
        )
    return pd.DataFrame(rows)


def alignment_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`alignment_frame` for people: ✓ for equal ids and reused positions, headers in `words`."""
    headers = {c: words["align_" + c.replace(" ", "_")] for c in frame.columns}
    missing = lambda v: "" if v is None or v != v else str(int(v))  # noqa: E731 — a shorter prompt has no id there
    return readable(
        frame, headers, {"cached id": missing, "new id": missing, "same id": check_mark, "reused": check_mark}
    )


def policies_figure(
    reuse: dict[str, PolicyReuse], block_size: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """One row per policy over the prompt's positions: each block (block policy) or token a cell, green where
    it was reused (hit), grey where it is computed (miss)."""
    fig = go.Figure()
    n = 0
    for policy, result in reuse.items():
        n = result.reused_tokens + result.computed_tokens
        width = block_size if result.unit == "block" else 1
        cells = [(i * width, min(width, n - i * width), hit) for i, hit in enumerate(result.hits)]
        if len(cells) > MOST_LABELLED:  # one bar per run of hits or misses: the same colours, in bounded bars
            cells = runs(cells)
        starts, widths, hits = zip(*cells) if cells else ((), (), ())
        colors = [HIT_COLOR if h else MISS_COLOR for h in hits]
        fig.add_bar(
            y=[words["policy_" + policy]] * len(starts),
            x=widths,
            base=starts,
            orientation="h",
            marker=dict(color=colors, line=dict(color="white", width=1)),
            text=[words["hit"] if h else words["miss"] for h in hits],
            textposition="inside",
            insidetextanchor="middle",
            textangle=0,
            textfont=dict(color=[text_color_on(c) for c in colors]),
            customdata=[f"{s}–{s + w - 1}" for s, w in zip(starts, widths)],
            hovertemplate=words["pos"] + " %{customdata}: %{text}<extra></extra>",
            showlegend=False,
        )
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        xaxis=dict(title=words["pos_axis"], dtick=tick_step(n, block_size)),
        uniformtext=dict(mode="hide", minsize=9),  # a word too wide for its cell is left to the colour
        yaxis=dict(autorange="reversed"),
    )
    return finish(fig, title, large, height=240 if large else 200)


def runs(cells: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """(start, width, hit) cells in order, neighbours with the same hit joined into one."""
    joined: list[tuple[int, int, bool]] = []
    for start, width, hit in cells:
        if joined and joined[-1][2] == hit:
            joined[-1] = (joined[-1][0], joined[-1][1] + width, hit)
        else:
            joined.append((start, width, hit))
    return joined


def policy_frame(reuse: dict[str, int], prompt_length: int) -> pd.DataFrame:
    rows = []
    for policy, reused in reuse.items():
        rows.append(
            {
                "policy": policy,
                "reused tokens": reused,
                "computed tokens": prompt_length - reused,
                "prefill saved": f"{100 * reused / prompt_length:.0f}%",
            }
        )
    return pd.DataFrame(rows)


def policy_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`policy_frame` for people: policy names and headers in `words`."""
    headers = {c: words["pol_" + c.replace(" ", "_")] for c in frame.columns}
    return readable(
        frame, headers, {"policy": lambda p: words["policy_" + p], "reused tokens": fmt_int, "computed tokens": fmt_int}
    )
