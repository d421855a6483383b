"""The paged KV cache: physical blocks and their slots, the block table, and what it costs in bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.model import ModelInfo
from viz.style import OKABE_ITO, SEQUENTIAL, finish, position_ticks, window

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def block_table_frame(block_table: list[int], length: int, block_size: int, labels: list[str]) -> pd.DataFrame:
    """Logical block → physical block, the positions it covers and the tokens whose K/V it holds."""
    rows = []
    for logical, physical in enumerate(block_table):
        start = logical * block_size
        end = min(start + block_size, length)
        rows.append({"logical": logical, "physical": physical, "positions": f"{start}–{end - 1}" if end > start else "–",
                     "filled": f"{max(0, end - start)}/{block_size}", "tokens": " ".join(labels[start:end])})
    return pd.DataFrame(rows)


def pool_figure(block_table: list[int], length: int, block_size: int, num_blocks: int, labels: list[str],
                title: str = "", large: bool = False, spare: int = 3) -> go.Figure:
    """Physical blocks as rows of slots (up to the highest one in use, plus a few free ones); a slot
    shows the token whose K/V it stores."""
    owner = {physical: logical for logical, physical in enumerate(block_table)}
    shown = min(num_blocks, max(block_table, default=-1) + 1 + spare)
    z = np.full((shown, block_size), np.nan)
    text = [[""] * block_size for _ in range(shown)]
    for physical in range(shown):
        logical = owner.get(physical)
        if logical is None:
            continue
        for offset in range(block_size):
            position = logical * block_size + offset
            if position < length:
                z[physical, offset] = logical
                text[physical][offset] = f"{position}:{labels[position]}"
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale=SEQUENTIAL, showscale=False,
                               xgap=2, ygap=2, hovertemplate="block %{y}, slot %{x}<br>%{text}<extra></extra>"))
    fig.update_layout(xaxis=dict(title="slot (offset in block)", dtick=1),
                      yaxis=dict(title="physical block", autorange="reversed", dtick=1))
    return finish(fig, title, large, height=min(900, 120 + 30 * shown))


def kv_bytes_frame(info: ModelInfo, length: int) -> pd.DataFrame:
    """Bytes per token and for `length` tokens: as loaded (GQA) and as MHA would need, by dtype."""
    rows = []
    for dtype, size in DTYPE_BYTES.items():
        for layout, kv_heads in (("GQA (as loaded)", info.kv_heads), ("MHA (one K/V per Q head)", info.q_heads)):
            per_token = 2 * info.layers * kv_heads * info.head_dim * size
            rows.append({"dtype": dtype, "layout": layout, "kv_heads": kv_heads,
                         "formula": f"2 × {info.layers} × {kv_heads} × {info.head_dim} × {size}",
                         "bytes per token": per_token, f"bytes for {length} tokens": per_token * length})
    return pd.DataFrame(rows)


def kv_values_figure(values: np.ndarray, labels: list[str], title: str = "", large: bool = False) -> go.Figure:
    """One layer's cached K (or V) for one KV head: positions × head_dim numbers. Not tokens, not ids."""
    shown = window(values.shape[0])
    ticks = position_ticks(labels, shown)
    fig = go.Figure(go.Heatmap(z=values[shown], y=ticks, colorscale="RdBu", zmid=0,
                               hovertemplate="%{y}<br>dim %{x}: %{z:.4f}<extra></extra>"))
    fig.update_layout(xaxis=dict(title="head_dim"), yaxis=dict(autorange="reversed"))
    return finish(fig, title, large, height=min(700, 120 + 14 * len(ticks)))


def occupancy_bar(used: int, cached: int, total: int, title: str = "", large: bool = False) -> go.Figure:
    free = total - used - cached
    fig = go.Figure()
    for name, value, color in (("in use", used, OKABE_ITO["vermillion"]), ("cached, free", cached, OKABE_ITO["green"]),
                               ("empty", free, OKABE_ITO["grey"])):
        fig.add_bar(x=[value], y=["blocks"], orientation="h", name=name, marker_color=color,
                    hovertemplate=f"{name}: %{{x}}<extra></extra>")
    fig.update_layout(barmode="stack", xaxis=dict(range=[0, total]), legend=dict(orientation="h"))
    return finish(fig, title, large, height=160)
