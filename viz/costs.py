"""Costs: the bytes a decode step reads (weights + a batch's K/V) and where the K/V passes the weights; prefill
versus decode per token, measured steadily, beside the floor the bytes set; time per step as the run went, K/V
read per decode step, and how memory and work grow with context."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.model_info import ModelInfo
from engine.timing import DecodeTiming, crossover_context, weight_bytes_read
from engine.trace import StepTrace
from viz.style import (
    GENERATED_COLOR,
    OKABE_ITO,
    PROMPT_COLOR,
    finish,
    first_screen_height,
    fmt_bytes,
    fmt_int,
    fmt_ms,
    readable,
)
from viz.words import ENGLISH, Words

STEP_HEADERS = {
    "step": "step",
    "phase": "phase",
    "tokens in": "tokens_in",
    "cached positions": "cached_positions",
    "K/V bytes read": "kv_bytes_read",
    "forward ms": "forward_ms",
    "total ms": "total_ms",
}


def steps_frame(traces: list[StepTrace], info: ModelInfo) -> pd.DataFrame:
    """One row per forward pass: its phase, tokens in, cached positions read and time."""
    rows = []
    for t in traces:
        rows.append(
            {
                "step": t.step,
                "phase": t.phase,
                "tokens in": len(t.input_ids),
                "cached positions": t.context_length,
                "K/V bytes read": info.kv_bytes(t.context_length),
                "forward ms": t.timings_ms.get("forward", 0.0),
                "total ms": t.timings_ms.get("total", 0.0),
            }
        )
    return pd.DataFrame(rows)


def steps_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`steps_frame` for people: separators, bytes with units, ms with 1–2 decimals, headers in `words`."""
    formats = {
        "phase": lambda p: words["phase_" + p],
        "tokens in": fmt_int,
        "cached positions": fmt_int,
        "K/V bytes read": fmt_bytes,
        "forward ms": fmt_ms,
        "total ms": fmt_ms,
    }
    return readable(frame, {c: words[key] for c, key in STEP_HEADERS.items()}, formats)


def per_token_figure(timing: DecodeTiming, title: str = "", large: bool = False, words: Words = ENGLISH) -> go.Figure:
    """Milliseconds per token, measured just now: prefill (median prefill ÷ its tokens), decode (median step, with
    p10–p90 as an error bar) and, when it is below every timed step, decode's floor (its bytes ÷ peak bandwidth).
    One bar trace each, in that order."""
    low, high = timing.decode_spread
    median = timing.decode_median
    spread = dict(
        type="data",
        symmetric=False,
        array=[high - median],
        arrayminus=[median - low],
        color=OKABE_ITO["black"],
        thickness=2,
    )
    prefill = words["prefill_per_token"].format(n=timing.prompt, tries=len(timing.prefill_ms))
    bars = [
        (prefill, timing.prefill_ms_per_token, PROMPT_COLOR, None),
        (words["decode_per_token"].format(n=len(timing.decode_ms)), median, GENERATED_COLOR, spread),
    ]
    if timing.floor_holds:
        bars.append((words["memory_floor"], timing.floor_ms, OKABE_ITO["grey"], None))
    fig = go.Figure()
    for label, ms, color, error in bars:
        fig.add_bar(
            y=[label],
            x=[ms],
            orientation="h",
            marker_color=color,
            text=None if error else [fmt_ms(ms)],
            textposition="auto",
            error_x=error,
            showlegend=False,
            hovertemplate="%{y}: %{x:.2f} " + words["ms"] + "<extra></extra>",
        )
        if error:  # its number past the end of the spread, where nothing crosses it
            fig.add_annotation(x=max(ms, high), y=label, text=fmt_ms(ms), xanchor="left", xshift=8, showarrow=False)
    fig.update_layout(xaxis=dict(title=words["ms_per_token"], rangemode="tozero"), yaxis=dict(autorange="reversed"))
    return finish(fig, title, large, height=140 + 50 * len(bars))


def step_bytes_figure(
    models: list[tuple[str, ModelInfo]],
    batch: int,
    context: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
    points: int = 65,
) -> go.Figure:
    """Per model (one panel each, named on its x axis): MiB one decode step reads for `batch` requests against
    their context, up to the model's limit: the weights (read once for the whole batch) and the batch's K/V,
    where the K/V passes the weights, and the run's `context` marked on the K/V line."""
    fig = make_subplots(rows=1, cols=len(models), horizontal_spacing=0.1)
    for col, (label, info) in enumerate(models, start=1):
        lengths = [info.context_limit * i // (points - 1) for i in range(points)]
        weights = weight_bytes_read(info) / 2**20
        first = col == 1
        fig.add_scatter(
            x=lengths,
            y=[weights] * points,
            mode="lines",
            name=words["bytes_weights"],
            row=1,
            col=col,
            line=dict(color=OKABE_ITO["grey"], width=3),
            legendgroup="w",
            showlegend=first,
            hovertemplate=words["bytes_weights"] + ": %{y:,.0f} MiB<extra></extra>",
        )
        fig.add_scatter(
            x=lengths,
            y=[batch * info.kv_bytes(n) / 2**20 for n in lengths],
            mode="lines",
            name=words["bytes_kv"].format(batch=batch),
            row=1,
            col=col,
            legendgroup="kv",
            line=dict(color=OKABE_ITO["vermillion"], width=3),
            showlegend=first,
            hovertemplate="%{x:,}: %{y:,.1f} MiB<extra></extra>",
        )
        fig.add_scatter(
            x=[context],
            y=[batch * info.kv_bytes(context) / 2**20],
            mode="markers",
            name=words["bytes_this_context"],
            row=1,
            col=col,
            legendgroup="here",
            showlegend=first,
            marker=dict(color=OKABE_ITO["black"], size=10),
            hovertemplate=words["bytes_this_context"] + " %{x:,}: %{y:,.2f} MiB<extra></extra>",
        )
        cross = crossover_context(info, batch)
        if cross <= info.context_limit:
            fig.add_vline(x=cross, line_dash="dot", row=1, col=col)
            # The label at the top, on the wider side of the line: the lines are low there, and the ticks far.
            left = cross < info.context_limit / 2
            fig.add_annotation(
                x=cross,
                y=1,
                yref="y domain",
                yanchor="top",
                row=1,
                col=col,
                xanchor="left" if left else "right",
                xshift=4 if left else -4,
                showarrow=False,
                text=words["bytes_cross"].format(n=f"{cross:,}"),
                bgcolor="rgba(255,255,255,0.85)",
            )
        fig.update_xaxes(title_text=f"{label} · {words['context_positions']}", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text=words["mib_per_step"] if first else None, rangemode="tozero", row=1, col=col)
    return legend_above(finish(fig, title, large, height=first_screen_height(large)), bool(title), large)


def legend_above(fig: go.Figure, titled: bool, large: bool) -> go.Figure:
    """One row of legend between the title and the plot, in a top margin made for both: a legend below the
    plot would cover the x axis's title."""
    row = 34 if large else 26
    fig.update_layout(
        legend=dict(orientation="h", x=0, xanchor="left", y=1, yanchor="bottom"),
        title=dict(y=1, yref="container", yanchor="top", pad=dict(t=8)),
        margin=dict(t=(row + 12 if titled else 0) + row + 8),
    )
    return fig


def step_times_figure(frame: pd.DataFrame, title: str = "", large: bool = False, words: Words = ENGLISH) -> go.Figure:
    colors = [PROMPT_COLOR if p == "prefill" else GENERATED_COLOR for p in frame["phase"]]
    phases = [words["phase_" + p] for p in frame["phase"]]
    fig = go.Figure(
        go.Bar(
            x=frame["step"],
            y=frame["total ms"],
            marker_color=colors,
            customdata=list(zip(phases, frame["tokens in"])),
            hovertemplate=words["step_hover"] + "<extra></extra>",
        )
    )
    fig.update_layout(xaxis=dict(title=words["step"]), yaxis=dict(title=words["ms"]))
    return finish(fig, title, large, height=320)


def kv_read_figure(
    frame: pd.DataFrame, layers: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """Every decode step re-reads all cached K/V in every layer: bytes grow with the context."""
    decode = frame[frame["phase"] == "decode"]
    fig = go.Figure(
        go.Scatter(
            x=decode["step"],
            y=decode["K/V bytes read"] / 2**20,
            mode="lines+markers",
            line=dict(color=OKABE_ITO["vermillion"]),
            hovertemplate=words["kv_read_hover"].format(layers=layers) + "<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis=dict(title=words["decode_step"]), yaxis=dict(title=words["mib_per_step"], rangemode="tozero")
    )
    return finish(fig, title, large, height=320)


def growth_lengths(info: ModelInfo) -> list[int]:
    """The lengths the growth chart is drawn at: sixteenths of the model's limit, and its sliding window, where a
    local layer's K/V stops growing (so the chart bends where the model does)."""
    limit = info.context_limit
    window = info.sliding_window
    return sorted({max(1, limit * i // 16) for i in range(17)} | ({window} if window and window < limit else set()))


def attention_scores(info: ModelInfo, length: int) -> int:
    """Attention scores a prefill of `length` positions computes: every query head of every layer scores each
    position against the keys it reads, all earlier ones (a global layer, n(n+1)/2 in all) or at most a local
    layer's window (past the window, `window` more a position: linear)."""
    total = 0
    for layer in range(info.layers):
        window = info.window(layer)
        if window is None or length <= window:
            total += length * (length + 1) // 2
        else:
            total += window * (window + 1) // 2 + (length - window) * window
    return info.q_heads * total


def context_growth_frame(info: ModelInfo, lengths: list[int]) -> pd.DataFrame:
    """KV memory grows linearly with length (past a sliding window, in the global layers only); attention scores
    (work) quadratically (a local layer's, past its window, linearly)."""
    return pd.DataFrame(
        {
            "tokens": lengths,
            "KV cache MiB": [info.kv_bytes(n) / 2**20 for n in lengths],
            "attention scores (millions)": [attention_scores(info, n) / 1e6 for n in lengths],
        }
    )


def context_growth_figure(
    frame: pd.DataFrame,
    limit: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
    window: int | None = None,
) -> go.Figure:
    """The growth chart; with a sliding `window`, its lines bend there and a dotted line marks it."""
    fig = go.Figure()
    kv_name, scores_name = (
        (words["growth_kv"], words["growth_scores"])
        if window is None
        else (words["growth_kv_window"].format(w=f"{window:,}"), words["growth_scores_window"])
    )
    fig.add_scatter(
        x=frame["tokens"],
        y=frame["KV cache MiB"],
        name=kv_name,
        mode="lines",
        line=dict(color=OKABE_ITO["blue"]),
        hovertemplate="%{x:,}: %{y:,.1f} MiB",
    )
    fig.add_scatter(
        x=frame["tokens"],
        y=frame["attention scores (millions)"],
        name=scores_name,
        mode="lines",
        yaxis="y2",
        line=dict(color=OKABE_ITO["orange"]),
        hovertemplate="%{x:,}: %{y:,.1f} " + words["millions"],
    )
    fig.add_vline(
        x=limit,
        line_dash="dash",
        annotation_text=words["context_limit"].format(limit=f"{limit:,}"),
        annotation_position="bottom left",
    )  # where the lines are low: they end at the top right
    if window is not None and window < limit:
        fig.add_vline(x=window, line_dash="dot", line_color=OKABE_ITO["grey"])
    # 8,000 and 7,190 as the text writes them (not 8000, nor 5k in Chinese); the right axis's ticks sit at fractions
    # of its top (aligned with the left's), so 4 significant digits, not 7,189.78902476
    fig.update_layout(
        xaxis=dict(title=words["tokens"], tickformat=","),
        yaxis=dict(title="MiB", rangemode="tozero", tickformat=",.4~r"),
        yaxis2=dict(title=words["millions"], overlaying="y", side="right", rangemode="tozero", tickformat=",.4~r"),
    )
    return legend_above(finish(fig, title, large, height=380), bool(title), large)
