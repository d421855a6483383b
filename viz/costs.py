"""Costs: time per step, K/V read per decode step, and how memory and work grow with context."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.model import ModelInfo
from engine.trace import StepTrace
from viz.style import GENERATED_COLOR, OKABE_ITO, PROMPT_COLOR, finish


def steps_frame(traces: list[StepTrace], info: ModelInfo) -> pd.DataFrame:
    """One row per forward pass: its phase, tokens in, cached positions read and time."""
    rows = []
    for t in traces:
        rows.append({"step": t.step, "phase": t.phase, "tokens in": len(t.input_ids),
                     "cached positions": t.context_length,
                     "K/V bytes read": t.context_length * info.kv_bytes_per_token,
                     "forward ms": t.timings_ms.get("forward", 0.0), "total ms": t.timings_ms.get("total", 0.0)})
    return pd.DataFrame(rows)


def step_times_figure(frame: pd.DataFrame, title: str = "", large: bool = False) -> go.Figure:
    colors = [PROMPT_COLOR if p == "prefill" else GENERATED_COLOR for p in frame["phase"]]
    fig = go.Figure(go.Bar(x=frame["step"], y=frame["total ms"], marker_color=colors,
                           customdata=frame[["phase", "tokens in"]],
                           hovertemplate="step %{x} (%{customdata[0]}, %{customdata[1]} tokens): %{y:.1f} ms"
                                         "<extra></extra>"))
    fig.update_layout(xaxis=dict(title="step"), yaxis=dict(title="ms"))
    return finish(fig, title, large, height=320)


def kv_read_figure(frame: pd.DataFrame, layers: int, title: str = "", large: bool = False) -> go.Figure:
    """Every decode step re-reads all cached K/V in every layer: bytes grow with the context."""
    decode = frame[frame["phase"] == "decode"]
    fig = go.Figure(go.Scatter(x=decode["step"], y=decode["K/V bytes read"] / 2**20, mode="lines+markers",
                               line=dict(color=OKABE_ITO["vermillion"]),
                               hovertemplate="step %{x}: %{y:.2f} MiB of K/V read in " + str(layers) +
                                             " layers<extra></extra>"))
    fig.update_layout(xaxis=dict(title="decode step"), yaxis=dict(title="MiB read per step", rangemode="tozero"))
    return finish(fig, title, large, height=320)


def context_growth_frame(info: ModelInfo, lengths: list[int]) -> pd.DataFrame:
    """KV memory grows linearly with length; attention scores (work) quadratically."""
    return pd.DataFrame({
        "tokens": lengths,
        "KV cache MiB": [n * info.kv_bytes_per_token / 2**20 for n in lengths],
        "attention scores (millions)": [info.layers * info.q_heads * n * (n + 1) / 2 / 1e6 for n in lengths],
    })


def context_growth_figure(frame: pd.DataFrame, limit: int, title: str = "", large: bool = False) -> go.Figure:
    fig = go.Figure()
    fig.add_scatter(x=frame["tokens"], y=frame["KV cache MiB"], name="KV cache (MiB): linear", mode="lines",
                    line=dict(color=OKABE_ITO["blue"]))
    fig.add_scatter(x=frame["tokens"], y=frame["attention scores (millions)"], name="prefill scores (M): quadratic",
                    mode="lines", yaxis="y2", line=dict(color=OKABE_ITO["orange"]))
    fig.add_vline(x=limit, line_dash="dash", annotation_text=f"context limit {limit}")
    fig.update_layout(xaxis=dict(title="tokens"), yaxis=dict(title="MiB", rangemode="tozero"),
                      yaxis2=dict(title="millions", overlaying="y", side="right", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.2))
    return finish(fig, title, large, height=360)
