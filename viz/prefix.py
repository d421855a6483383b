"""Prefix caching: the new prompt aligned with the closest cached one, and reuse under each policy."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from viz.style import HIT_COLOR, MISS_COLOR, check_mark, finish, fmt_int, readable
from viz.words import ENGLISH, Words


def alignment_frame(cached: list[int], new: list[int], cached_labels: list[str], new_labels: list[str],
                    reused: int) -> pd.DataFrame:
    """Position by position: cached id, new id, equal or not, and whether the new prompt reused it."""
    rows = []
    for p in range(max(len(cached), len(new))):
        old = cached[p] if p < len(cached) else None
        now = new[p] if p < len(new) else None
        rows.append({"position": p, "cached token": cached_labels[p] if old is not None else "",
                     "cached id": old, "new id": now, "new token": new_labels[p] if now is not None else "",
                     "same id": old is not None and old == now, "reused": p < reused})
    return pd.DataFrame(rows)


def alignment_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`alignment_frame` for people: ✓ for equal ids and reused positions, headers in `words`."""
    headers = {c: words["align_" + c.replace(" ", "_")] for c in frame.columns}
    missing = lambda v: "" if v is None or v != v else str(int(v))  # noqa: E731 — a shorter prompt has no id there
    return readable(frame, headers, {"cached id": missing, "new id": missing, "same id": check_mark,
                                     "reused": check_mark})


def hits_figure(hits: list[bool], unit: str, block_size: int, title: str = "", large: bool = False,
                words: Words = ENGLISH) -> go.Figure:
    """One cell per prompt block (block policy) or token: reused (hit) or computed (miss)."""
    labels = [words["hits_block"].format(i=i, start=i * block_size, end=i * block_size + block_size - 1)
              if unit == "block" else words["hits_pos"].format(i=i) for i in range(len(hits))]
    fig = go.Figure(go.Bar(x=labels, y=[1] * len(hits), marker_color=[HIT_COLOR if h else MISS_COLOR for h in hits],
                           text=[words["hit"] if h else words["miss"] for h in hits], textposition="inside",
                           hovertemplate="%{x}: %{text}<extra></extra>"))
    fig.update_layout(yaxis=dict(visible=False), bargap=0.05, xaxis=dict(tickangle=-60))
    return finish(fig, title, large, height=260)


def policy_frame(reuse: dict[str, int], prompt_length: int) -> pd.DataFrame:
    rows = []
    for policy, reused in reuse.items():
        rows.append({"policy": policy, "reused tokens": reused, "computed tokens": prompt_length - reused,
                     "prefill saved": f"{100 * reused / prompt_length:.0f}%"})
    return pd.DataFrame(rows)


def policy_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`policy_frame` for people: policy names and headers in `words`."""
    headers = {c: words["pol_" + c.replace(" ", "_")] for c in frame.columns}
    return readable(frame, headers, {"policy": lambda p: words["policy_" + p], "reused tokens": fmt_int,
                                     "computed tokens": fmt_int})
