"""What the KV cache costs in bytes: per token by dtype and layout (GQA as loaded, MHA), and per layer where a
sliding window keeps fewer positions than the sequence has."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.kv_cache import kv_bytes_per_token
from engine.model_info import ModelInfo
from viz.style import OKABE_ITO, TOP_LEGEND, finish, first_screen_height, fmt_bytes, readable
from viz.words import ENGLISH, Words

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


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
