"""The paged KV cache: physical blocks and their slots, the block table, and what it costs in bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from engine.kv_cache import kv_bytes_per_token
from engine.model_info import ModelInfo
from viz.style import (
    MOST_LABELLED,
    OKABE_ITO,
    SEQUENTIAL,
    TOP_LEGEND,
    finish,
    first_screen_height,
    fmt_bytes,
    plotly_text,
    position_ticks,
    readable,
    text_color_on,
    tick_step,
    window,
)
from viz.words import ENGLISH, Words

SLOT_TEXT_SIZE = 12  # px; 15 on a projector
POOL_MAX_HEIGHT = 900  # px: the pool's rows squeeze beyond this (block size 1 on a long prompt)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


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


def kv_bytes_frame(info: ModelInfo, length: int) -> pd.DataFrame:
    """Bytes per token and for `length` tokens: as loaded (GQA) and as MHA would need, by dtype (numbers). The
    total counts what each layer keeps (`ModelInfo.cached_positions`: a sliding-window layer at most its window)."""
    rows = []
    kept = sum(info.cached_positions(layer, length) for layer in range(info.layers))  # positions, over all layers
    for dtype, size in DTYPE_BYTES.items():
        for layout, kv_heads in (("GQA (as loaded)", info.kv_heads), ("MHA (one K/V per Q head)", info.q_heads)):
            per_token = kv_bytes_per_token(info.layers, kv_heads, info.head_dim, size)
            rows.append(
                {
                    "dtype": dtype,
                    "layout": layout,
                    "kv_heads": kv_heads,
                    "formula": f"2 × {info.layers} × {kv_heads} × {info.head_dim} × {size}",
                    "bytes per token": per_token,
                    f"bytes for {length} tokens": kv_bytes_per_token(1, kv_heads, info.head_dim, size) * kept,
                }
            )
    return pd.DataFrame(rows)


def layer_lengths_frame(info: ModelInfo, length: int) -> pd.DataFrame:
    """Per layer, for a sequence of `length`: its kind (local: a sliding window; global), its window, the positions
    its cache keeps and their K/V bytes (numbers)."""
    per_position = kv_bytes_per_token(1, info.kv_heads, info.head_dim, info.element_bytes)
    return pd.DataFrame(
        [
            {
                "layer": layer,
                "kind": info.layer_kinds[layer],
                "window": info.window(layer),
                "cached": info.cached_positions(layer, length),
                "bytes": per_position * info.cached_positions(layer, length),
            }
            for layer in range(info.layers)
        ]
    )


def lengths_default(info: ModelInfo, length: int) -> int:
    """The sequence length the per-layer picture opens at: the run's, or long enough for a sliding window to have
    slid (four windows), within the model's limit."""
    window = info.sliding_window
    return min(info.context_limit, max(length, 4 * window if window else length))


def window_saving(info: ModelInfo, length: int) -> tuple[int, int]:
    """K/V bytes of a `length`-position sequence: as loaded, and if every layer were global (kept it all)."""
    return info.kv_bytes(length), length * info.kv_bytes_per_token


def layer_lengths_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`layer_lengths_frame` for people: kinds and headers in `words`, bytes with units."""
    headers = {
        "layer": words["layer"],
        "kind": words["layer_kind"],
        "window": words["window"],
        "cached": words["cached_positions"],
        "bytes": words["kv_bytes"],
    }
    formats = {
        "kind": lambda k: words["kind_" + k],
        "window": lambda w: "–" if pd.isna(w) else f"{int(w):,}",
        "cached": lambda n: f"{n:,}",
        "bytes": fmt_bytes,
    }
    return readable(frame, headers, formats)


def layer_lengths_figure(
    frame: pd.DataFrame, length: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """One bar per layer: the positions its cache keeps, coloured by kind (a local layer stops at its window, a
    global one keeps all), and the sequence's whole length as a dashed line."""
    fig = go.Figure()
    for kind, color in (("local", OKABE_ITO["blue"]), ("global", OKABE_ITO["vermillion"])):
        rows = frame[frame["kind"] == kind]
        if len(rows):
            fig.add_bar(
                x=rows["layer"],
                y=rows["cached"],
                name=words["kind_" + kind],
                marker_color=color,
                hovertemplate=words["layer"] + " %{x}: %{y:,}<extra>" + words["kind_" + kind] + "</extra>",
            )
    fig.add_hline(
        y=length,
        line_dash="dash",
        annotation_text=words["all_positions"].format(n=f"{length:,}"),
        annotation_position="top left",
    )
    fig.update_layout(
        xaxis=dict(title=words["layer"], dtick=1),
        yaxis=dict(title=words["cached_positions"], rangemode="tozero"),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=first_screen_height(large))


def kv_bytes_table(info: ModelInfo, length: int, words: Words = ENGLISH) -> pd.DataFrame:
    """`kv_bytes_frame` for people: bytes with separators and units, headers and layouts in `words`."""
    frame = kv_bytes_frame(info, length)
    total = f"bytes for {length} tokens"
    layouts = {"GQA (as loaded)": words["layout_gqa"], "MHA (one K/V per Q head)": words["layout_mha"]}
    total_header = words["bytes_for_one"] if length == 1 else words["bytes_for"].format(n=f"{length:,}")
    headers = {
        "dtype": words["dtype"],
        "layout": words["layout"],
        "kv_heads": words["kv_heads"],
        "formula": words["formula"],
        "bytes per token": words["bytes_per_token"],
        total: total_header,
    }
    return readable(frame, headers, {"layout": layouts.get, "bytes per token": fmt_bytes, total: fmt_bytes})


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


def contexts_figure(
    key_cosines: list[float],
    unrotated_cosines: list[float] | None,
    value_cosines: list[float],
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """One token in two contexts, per layer: the cosine between its two keys as cached (after RoPE), between the two
    keys turned back by their positions (before RoPE; None without RoPE), and between its two values."""
    layers = list(range(len(key_cosines)))
    fig = go.Figure()
    lines = [
        ("contexts_key_unrotated", unrotated_cosines, OKABE_ITO["blue"], "solid"),
        ("contexts_key", key_cosines, OKABE_ITO["sky"], "dot"),
        ("contexts_value", value_cosines, OKABE_ITO["vermillion"], "solid"),
    ]
    for name, values, color, dash in lines:
        if values is not None:
            fig.add_scatter(
                x=layers,
                y=values,
                mode="lines+markers",
                name=words[name],
                line=dict(color=color, dash=dash),
                hovertemplate=words["layer"] + " %{x}: %{y:.4f}<extra>" + words[name] + "</extra>",
            )
    fig.update_layout(
        xaxis=dict(title=words["layer"], dtick=max(1, len(layers) // 15), range=[-0.5, len(layers) - 0.5]),
        yaxis=dict(title=words["contexts_cosine"]),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=first_screen_height(large))
