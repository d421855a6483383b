"""The paged KV cache: physical blocks and their slots, the block table, how full the pool is (alone or shared
with other requests), and the K/V numbers a layer keeps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from viz.style import (
    MOST_LABELLED,
    OKABE_ITO,
    SEQUENTIAL,
    TOP_LEGEND,
    finish,
    plotly_text,
    position_ticks,
    text_color_on,
    tick_step,
    window,
)
from viz.words import ENGLISH, Words

SLOT_TEXT_SIZE = 12  # px; 15 on a projector
POOL_MAX_HEIGHT = 900  # px: the pool's rows squeeze beyond this (block size 1 on a long prompt)


def block_table_frame(
    block_table: list[int], length: int, block_size: int, labels: list[str], words: Words = ENGLISH
) -> pd.DataFrame:
    """Logical block → physical block, the positions it covers and the tokens whose K/V it holds.
    Headers from `words` (keys bt_logical, bt_physical, …)."""
    rows = []
    for logical, physical in enumerate(block_table):
        start = logical * block_size
        end = min(start + block_size, length)
        rows.append(
            {
                "logical": logical,
                "physical": physical,
                "positions": f"{start}–{end - 1}" if end > start else "–",
                "filled": f"{max(0, end - start)}/{block_size}",
                "tokens": " ".join(labels[start:end]),
            }
        )
    frame = pd.DataFrame(rows, columns=["logical", "physical", "positions", "filled", "tokens"])
    return frame.rename(columns={c: words["bt_" + c] for c in frame.columns})


def slot_label(text: str, keep: int = 5) -> str:
    """A slot's label on two lines, position over token, the token cut to `keep` characters: 16 slots share
    a row, and a longer label would run into its neighbours (the hover shows it whole)."""
    position, token = text.split(":", 1)
    return f"{position}<br>{token if len(token) <= keep else token[: keep - 1] + '…'}"


def pool_figure(
    block_table: list[int],
    length: int,
    block_size: int,
    num_blocks: int,
    labels: list[str],
    title: str = "",
    large: bool = False,
    spare: int = 3,
    words: Words = ENGLISH,
) -> go.Figure:
    """Physical blocks as rows of slots (up to the highest one in use, plus a few free ones); a slot
    shows the token whose K/V it stores, "position:token", in black or white, whichever reads on its cell."""
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
                text[physical][offset] = f"{position}:{plotly_text(labels[position])}"
    top = max(1, len(block_table) - 1)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            colorscale=SEQUENTIAL,
            zmin=0,
            zmax=top,
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate=words["block_slot_hover"] + "<br>%{text}<extra></extra>",
        )
    )
    height = 120 + (44 if large else 36) * shown  # rows of two-line slots
    if height <= POOL_MAX_HEIGHT and block_size <= MOST_LABELLED:  # else the slots are too small to write in
        cells = [(b, o) for b in range(shown) for o in range(block_size) if text[b][o]]
        backgrounds = sample_colorscale(SEQUENTIAL, [z[b, o] / top for b, o in cells])
        fig.add_trace(
            go.Scatter(
                x=[o for _, o in cells],
                y=[b for b, _ in cells],
                mode="text",
                text=[slot_label(text[b][o]) for b, o in cells],
                hoverinfo="skip",
                showlegend=False,
                textfont=dict(size=SLOT_TEXT_SIZE + (3 if large else 0), color=[text_color_on(c) for c in backgrounds]),
            )
        )
    fig.update_layout(
        xaxis=dict(title=words["slot_axis"], dtick=tick_step(block_size)),
        yaxis=dict(title=words["physical_block"], autorange="reversed", dtick=tick_step(shown)),
    )
    return finish(fig, title, large, height=min(POOL_MAX_HEIGHT, height))


def kv_values_figure(
    values: np.ndarray, labels: list[str], title: str = "", large: bool = False, words: Words = ENGLISH, start: int = 0
) -> go.Figure:
    """One layer's cached K (or V) for one KV head: positions × head_dim numbers. Not tokens, not ids. Row i is
    position `start` + i (a sliding-window layer keeps only its last positions)."""
    shown = window(values.shape[0])
    ticks = position_ticks(labels, slice(start + shown.start, start + shown.stop))
    fig = go.Figure(
        go.Heatmap(
            z=values[shown],
            y=ticks,
            colorscale="RdBu",
            zmid=0,
            hovertemplate="%{y}<br>" + words["dim"] + " %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(xaxis=dict(title=words["head_dim"]), yaxis=dict(autorange="reversed"))
    return finish(fig, title, large, height=min(700, 120 + 14 * len(ticks)))


def occupancy_bar(
    used: int, cached: int, total: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    free = total - used - cached
    fig = go.Figure()
    for key, value, color in (
        ("in_use", used, OKABE_ITO["vermillion"]),
        ("cached_free", cached, OKABE_ITO["green"]),
        ("empty", free, OKABE_ITO["grey"]),
    ):
        name = words[key]
        fig.add_bar(
            x=[value],
            y=[words["blocks"]],
            orientation="h",
            name=name,
            marker_color=color,
            hovertemplate=f"{name}: %{{x}}<extra></extra>",
        )
    fig.update_layout(barmode="stack", xaxis=dict(range=[0, total]), legend=TOP_LEGEND)
    return finish(fig, title, large, height=160)


def busy_pool_figure(
    block_table: list[int],
    length: int,
    block_size: int,
    others: dict[int, int],
    num_blocks: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """A pool other requests share, one column per physical block (slots top to bottom): this request's blocks
    coloured by their logical number, marked L0, L1 … above, each slot showing its position; the blocks other
    requests hold in grey; free blocks empty."""
    used = set(block_table) | set(others)
    shown = min(num_blocks, max(used, default=-1) + 2)
    mine = np.full((block_size, shown), np.nan)
    theirs = np.full((block_size, shown), np.nan)
    text = [[""] * shown for _ in range(block_size)]
    hover = [[words["block_free"]] * shown for _ in range(block_size)]
    for logical, physical in enumerate(block_table):
        for offset in range(block_size):
            position = logical * block_size + offset
            if position < length:
                mine[offset, physical] = logical
                text[offset][physical] = str(position)
                hover[offset][physical] = words["busy_mine_hover"].format(logical=logical, position=position)
    for physical, request in others.items():
        theirs[:, physical] = 0
        for offset in range(block_size):
            hover[offset][physical] = words["busy_other_hover"].format(request=request)
    top = max(1, len(block_table) - 1)
    fig = go.Figure()
    fig.add_heatmap(
        z=theirs,
        colorscale=[[0, OKABE_ITO["grey"]], [1, OKABE_ITO["grey"]]],
        showscale=False,
        xgap=2,
        ygap=2,
        hoverinfo="skip",
    )
    fig.add_heatmap(
        z=mine,
        text=text,
        customdata=hover,
        colorscale=SEQUENTIAL,
        zmin=0,
        zmax=top,
        showscale=False,
        xgap=2,
        ygap=2,
        hovertemplate=words["physical_block"] + " %{x}: %{customdata}<extra></extra>",
    )
    height = (150 if large else 130) + (40 if large else 34) * block_size
    if shown <= MOST_LABELLED and height <= POOL_MAX_HEIGHT:  # else too small to write in: the hover tells
        cells = [(o, b) for o in range(block_size) for b in range(shown) if text[o][b]]
        backgrounds = sample_colorscale(SEQUENTIAL, [mine[o, b] / top for o, b in cells])
        fig.add_scatter(
            x=[b for _, b in cells],
            y=[o for o, _ in cells],
            mode="text",
            text=[text[o][b] for o, b in cells],
            hoverinfo="skip",
            showlegend=False,
            textfont=dict(size=SLOT_TEXT_SIZE + (2 if large else 0), color=[text_color_on(c) for c in backgrounds]),
        )
        for logical, physical in enumerate(block_table):
            fig.add_annotation(
                x=physical,
                y=-0.5,
                yanchor="bottom",
                text=f"L{logical}",
                showarrow=False,
                font=dict(size=SLOT_TEXT_SIZE + (2 if large else 0)),
            )
    fig.update_layout(
        xaxis=dict(title=words["physical_block"], dtick=tick_step(shown), range=[-0.5, shown - 0.5]),
        yaxis=dict(title=words["slot_axis"], range=[block_size - 0.5, -0.5], dtick=tick_step(block_size)),
    )
    fig = finish(fig, title, large, height=min(POOL_MAX_HEIGHT, height))
    fig.update_layout(margin=dict(t=(80 if large else 70) if title else 40))  # the L labels sit above the blocks
    return fig


def difference_text(diff: float) -> str:
    """A largest difference for people: "0" when exact, else "2.4e-07"."""
    return f"{diff:.1e}" if diff else "0"
