"""Costs: time per step, prefill versus decode per token, the bytes a decode step must read and the
memory-bound floor they set, K/V read per decode step, and how memory and work grow with context."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from engine.model import ModelInfo
from engine.trace import StepTrace
from viz.style import GENERATED_COLOR, OKABE_ITO, PROMPT_COLOR, finish, fmt_bytes, fmt_int, fmt_ms, readable
from viz.words import ENGLISH, Words

STEP_HEADERS = {"step": "step", "phase": "phase", "tokens in": "tokens_in", "cached positions": "cached_positions",
                "K/V bytes read": "kv_bytes_read", "forward ms": "forward_ms", "total ms": "total_ms"}


def steps_frame(traces: list[StepTrace], info: ModelInfo) -> pd.DataFrame:
    """One row per forward pass: its phase, tokens in, cached positions read and time."""
    rows = []
    for t in traces:
        rows.append({"step": t.step, "phase": t.phase, "tokens in": len(t.input_ids),
                     "cached positions": t.context_length,
                     "K/V bytes read": t.context_length * info.kv_bytes_per_token,
                     "forward ms": t.timings_ms.get("forward", 0.0), "total ms": t.timings_ms.get("total", 0.0)})
    return pd.DataFrame(rows)


def steps_table(frame: pd.DataFrame, words: Words = ENGLISH) -> pd.DataFrame:
    """`steps_frame` for people: separators, bytes with units, ms with 1–2 decimals, headers in `words`."""
    formats = {"phase": lambda p: words["phase_" + p], "tokens in": fmt_int, "cached positions": fmt_int,
               "K/V bytes read": fmt_bytes, "forward ms": fmt_ms, "total ms": fmt_ms}
    return readable(frame, {c: words[key] for c, key in STEP_HEADERS.items()}, formats)


@dataclass(frozen=True)
class SteadyCosts:
    """Per-token times of one run and what a decode step must read from memory.

    Times exclude nothing but are robust to a cold step: decode is the median over the run's decode steps.
    """

    prefill_tokens: int
    prefill_ms_per_token: float
    decode_steps: int
    decode_ms_median: float | None  # None before the first decode step
    context: int  # positions the latest shown decode step read
    weight_bytes: int  # every weight is read once per forward pass
    kv_bytes: int  # the cached K/V of `context` positions, all layers
    bandwidth: float  # bytes per second, measured on this machine

    @property
    def decode_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def floor_ms(self) -> float:
        """The fastest a decode step can be when all it does is read its bytes once at `bandwidth`."""
        return 1000 * self.decode_bytes / self.bandwidth


def steady_costs(traces: list[StepTrace], info: ModelInfo, bandwidth: float) -> SteadyCosts:
    """traces: the run's steps shown so far (the prefill first); bandwidth in bytes per second."""
    prefill, decodes = traces[0], [t for t in traces[1:] if t.phase == "decode"]
    context = decodes[-1].context_length if decodes else prefill.context_length
    return SteadyCosts(
        prefill_tokens=len(prefill.input_ids),
        prefill_ms_per_token=prefill.timings_ms.get("total", 0.0) / max(1, len(prefill.input_ids)),
        decode_steps=len(decodes),
        decode_ms_median=statistics.median(t.timings_ms.get("total", 0.0) for t in decodes) if decodes else None,
        context=context,
        weight_bytes=info.parameters * info.element_bytes,
        kv_bytes=context * info.kv_bytes_per_token,
        bandwidth=bandwidth,
    )


def per_token_figure(costs: SteadyCosts, title: str = "", large: bool = False, words: Words = ENGLISH) -> go.Figure:
    """Milliseconds per token: prefill (its time / its tokens), decode (median step) and decode's memory floor."""
    bars = [(words["prefill_per_token"].format(n=costs.prefill_tokens), costs.prefill_ms_per_token, PROMPT_COLOR)]
    if costs.decode_ms_median is not None:
        bars.append((words["decode_per_token"].format(n=costs.decode_steps), costs.decode_ms_median, GENERATED_COLOR))
    bars.append((words["memory_floor"], costs.floor_ms, OKABE_ITO["grey"]))
    fig = go.Figure(go.Bar(y=[b[0] for b in bars], x=[b[1] for b in bars], orientation="h",
                           marker_color=[b[2] for b in bars], text=[fmt_ms(b[1]) for b in bars],
                           textposition="auto", hovertemplate="%{y}: %{x:.2f} " + words["ms"] + "<extra></extra>"))
    fig.update_layout(xaxis=dict(title=words["ms_per_token"], rangemode="tozero"), yaxis=dict(autorange="reversed"))
    return finish(fig, title, large, height=120 + 50 * len(bars))


def step_times_figure(frame: pd.DataFrame, title: str = "", large: bool = False, words: Words = ENGLISH) -> go.Figure:
    colors = [PROMPT_COLOR if p == "prefill" else GENERATED_COLOR for p in frame["phase"]]
    phases = [words["phase_" + p] for p in frame["phase"]]
    fig = go.Figure(go.Bar(x=frame["step"], y=frame["total ms"], marker_color=colors,
                           customdata=list(zip(phases, frame["tokens in"])),
                           hovertemplate=words["step_hover"] + "<extra></extra>"))
    fig.update_layout(xaxis=dict(title=words["step"]), yaxis=dict(title=words["ms"]))
    return finish(fig, title, large, height=320)


def kv_read_figure(frame: pd.DataFrame, layers: int, title: str = "", large: bool = False,
                   words: Words = ENGLISH) -> go.Figure:
    """Every decode step re-reads all cached K/V in every layer: bytes grow with the context."""
    decode = frame[frame["phase"] == "decode"]
    fig = go.Figure(go.Scatter(x=decode["step"], y=decode["K/V bytes read"] / 2**20, mode="lines+markers",
                               line=dict(color=OKABE_ITO["vermillion"]),
                               hovertemplate=words["kv_read_hover"].format(layers=layers) + "<extra></extra>"))
    fig.update_layout(xaxis=dict(title=words["decode_step"]), yaxis=dict(title=words["mib_per_step"],
                                                                         rangemode="tozero"))
    return finish(fig, title, large, height=320)


def context_growth_frame(info: ModelInfo, lengths: list[int]) -> pd.DataFrame:
    """KV memory grows linearly with length; attention scores (work) quadratically."""
    return pd.DataFrame({
        "tokens": lengths,
        "KV cache MiB": [n * info.kv_bytes_per_token / 2**20 for n in lengths],
        "attention scores (millions)": [info.layers * info.q_heads * n * (n + 1) / 2 / 1e6 for n in lengths],
    })


def context_growth_figure(frame: pd.DataFrame, limit: int, title: str = "", large: bool = False,
                          words: Words = ENGLISH) -> go.Figure:
    fig = go.Figure()
    fig.add_scatter(x=frame["tokens"], y=frame["KV cache MiB"], name=words["growth_kv"], mode="lines",
                    line=dict(color=OKABE_ITO["blue"]), hovertemplate="%{x:,}: %{y:,.1f} MiB")
    fig.add_scatter(x=frame["tokens"], y=frame["attention scores (millions)"], name=words["growth_scores"],
                    mode="lines", yaxis="y2", line=dict(color=OKABE_ITO["orange"]),
                    hovertemplate="%{x:,}: %{y:,.1f} " + words["millions"])
    fig.add_vline(x=limit, line_dash="dash", annotation_text=words["context_limit"].format(limit=f"{limit:,}"))
    fig.update_layout(xaxis=dict(title=words["tokens"]), yaxis=dict(title="MiB", rangemode="tozero"),
                      yaxis2=dict(title=words["millions"], overlaying="y", side="right", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.2))
    return finish(fig, title, large, height=360)
