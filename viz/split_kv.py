"""Split-KV (FlashDecoding): each split's range, max, sum, weight and partial output; the merge."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.split_kv import WorkedExample
from engine.trace import SplitKVTrace
from viz.style import OKABE_ITO, TOP_LEGEND, finish, first_screen_height, fmt_float, fmt_int, fmt_percent, readable
from viz.words import ENGLISH, Words

PREVIEW_DIMS = 4


def vector_text(values, digits: int = 4) -> str:
    """A vector as text to `digits` decimals, e.g. "[1.1254, -0.1440]"; a longer one shows its first
    PREVIEW_DIMS numbers, then "…"."""
    shown = ", ".join(f"{v:.{digits}f}" for v in values[:PREVIEW_DIMS])
    return f"[{shown}{', …' if len(values) > PREVIEW_DIMS else ''}]"


def split_frame(split: SplitKVTrace, layer: int, head: int) -> pd.DataFrame:
    rows = []
    for i, (start, end) in enumerate(split.ranges):
        m = split.max_score[layer, head, i].item()
        rows.append(
            {
                "split": i,
                "keys": f"{start}–{end - 1}" if end > start else "(empty)",
                "count": end - start,
                "m_i (max score)": m if np.isfinite(m) else None,
                "l_i (Σ e^(s−m_i))": split.exp_sum[layer, head, i].item(),
                "weight w_i/Σw": split.weight[layer, head, i].item(),
                "O_i (partial output)": vector_text(split.partial[layer, head, i].tolist()),
            }
        )
    return pd.DataFrame(rows)


def split_table(split: SplitKVTrace, layer: int, head: int, words: Words = ENGLISH) -> pd.DataFrame:
    """`split_frame` for people: 3 decimals, weights as percentages, headers in `words`."""
    frame = split_frame(split, layer, head)
    frame["keys"] = [k if k != "(empty)" else words["empty_split"] for k in frame["keys"]]
    headers = {
        "split": words["split"],
        "keys": words["keys"],
        "count": words["count"],
        "m_i (max score)": words["m_i"],
        "l_i (Σ e^(s−m_i))": "l_i = Σ e^(s−m_i)",
        "weight w_i/Σw": words["weight"],
        "O_i (partial output)": words["o_i"],
    }
    return readable(
        frame,
        headers,
        {"count": fmt_int, "m_i (max score)": fmt_float, "l_i (Σ e^(s−m_i))": fmt_float, "weight w_i/Σw": fmt_percent},
    )


def merge_frame(split: SplitKVTrace, layer: int, head: int) -> pd.DataFrame:
    merged = split.merged[layer, head].tolist()
    unsplit = split.unsplit[layer, head].tolist()
    return pd.DataFrame(
        {
            "dim": list(range(len(merged))),
            "merged": merged,
            "unsplit": unsplit,
            "|merged − unsplit|": [abs(a - b) for a, b in zip(merged, unsplit)],
        }
    )


def merge_table(split: SplitKVTrace, layer: int, head: int, words: Words = ENGLISH) -> pd.DataFrame:
    """`merge_frame` for people: values to 4 decimals, the difference in scientific notation."""
    frame = merge_frame(split, layer, head)
    headers = {
        "dim": words["dim"],
        "merged": words["merged"],
        "unsplit": words["unsplit"],
        "|merged − unsplit|": words["merge_diff"],
    }
    decimals = lambda x: fmt_float(x, 4)  # noqa: E731
    return readable(frame, headers, {"merged": decimals, "unsplit": decimals, "|merged − unsplit|": "{:.1e}".format})


def split_figure(
    split: SplitKVTrace, layer: int, head: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """Each split's partial output O_i (thin), the merged output and unsplit attention (thick) over head_dim."""
    fig = go.Figure()
    dims = list(range(split.partial.shape[-1]))
    palette = [OKABE_ITO[c] for c in ("sky", "orange", "green", "purple", "yellow", "blue")]
    for i, (start, end) in enumerate(split.ranges):
        if end == start:
            continue
        weight = split.weight[layer, head, i].item()
        fig.add_scatter(
            x=dims,
            y=split.partial[layer, head, i].tolist(),
            mode="lines",
            name=words["partial_name"].format(i=i, start=start, end=end - 1, w=f"{weight:.3f}"),
            line=dict(width=1, color=palette[i % len(palette)]),
        )
    fig.add_scatter(
        x=dims,
        y=split.unsplit[layer, head].tolist(),
        mode="lines",
        name=words["unsplit"],
        line=dict(width=6, color=OKABE_ITO["grey"]),
    )
    fig.add_scatter(
        x=dims,
        y=split.merged[layer, head].tolist(),
        mode="lines",
        name=words["merged_name"],
        line=dict(width=2, color=OKABE_ITO["vermillion"], dash="dash"),
    )
    fig.update_layout(xaxis=dict(title=words["head_dim"]), legend=TOP_LEGEND)
    return finish(fig, title, large, height=first_screen_height(large))  # the view's main figure


def worked_example_frame(example: WorkedExample, words: Words = ENGLISH) -> pd.DataFrame:
    rows = []
    for i, (start, end) in enumerate(example.ranges):
        rows.append(
            {
                words["split"]: i,
                words["keys"]: f"k{start}–k{end - 1}",
                words["scores"]: vector_text(example.scores[start:end], 3),
                "m_i": round(example.max_score[i], 3),
                "l_i": round(example.exp_sum[i], 3),
                "O_i": vector_text(example.partial[i], 3),
                "w_i/Σw": round(example.weight[i], 3),
            }
        )
    return pd.DataFrame(rows)
