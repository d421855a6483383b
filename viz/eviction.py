"""KV eviction drawn: which positions each (layer, KV head) kept, over the steps of one, where full attention would
have looked, the attention sink layer by layer, the bytes held, and the text under a policy beside the full cache's.

Inputs are the arrays `ui.runs.eviction` records per pass; a kept map codes each (layer, KV head, position) as
EVICTED (0), KEPT (1) or OUTSIDE_WINDOW (2: a sliding-window layer's own rule, Gemma 3's local layers).
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from viz.style import OKABE_ITO, SEQUENTIAL, TOP_LEGEND, finish, first_screen_height, fmt_size
from viz.words import ENGLISH, Words

EVICTED, KEPT, OUTSIDE_WINDOW = 0, 1, 2
STATE_COLORS = (OKABE_ITO["vermillion"], OKABE_ITO["blue"], "#DDDDDD")  # evicted, kept, outside the window
STATE_WORDS = ("evict_evicted", "evict_kept", "evict_outside")


def _state_scale() -> list:
    """A colour scale with one flat band per state, for z in 0 … 2."""
    scale = []
    for i, color in enumerate(STATE_COLORS):
        scale += [[i / 3, color], [(i + 1) / 3, color]]
    return scale


def _state_legend(fig: go.Figure, words: Words, states: tuple[int, ...] = (KEPT, EVICTED, OUTSIDE_WINDOW)) -> None:
    """The states' colours as a legend in one row above the plot (a colour bar beside it took half a phone's width)."""
    for state in states:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=words[STATE_WORDS[state]],
                marker=dict(symbol="square", size=14, color=STATE_COLORS[state]),
                hoverinfo="skip",
            )
        )
    fig.update_layout(legend=TOP_LEGEND, showlegend=True)


def row_names(layers: int, kv_heads: int, kinds: tuple[str, ...], words: Words) -> list[str]:
    """One name per (layer, KV head) row, for its hover: "layer 12 (local) · KV head 1"."""
    kind = {"local": f" ({words['kind_short_local']})", "global": ""}
    return [
        f"{words['layer']} {layer}{kind[kinds[layer]]} · {words['evict_kv_head']} {kv}"
        for layer in range(layers)
        for kv in range(kv_heads)
    ]


def kept_figure(
    kept: np.ndarray, kinds: tuple[str, ...], title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """kept: (layers, kv_heads, L) states at one pass; one row per (layer, KV head), one column per position. The
    axis names layers only (every few where there are many), each layer's KV heads in the rows under its tick."""
    layers, kv_heads, length = kept.shape
    rows = kept.reshape(layers * kv_heads, length)
    hover = np.array([words[w] for w in STATE_WORDS], dtype=object)[rows]
    names = np.array(row_names(layers, kv_heads, kinds, words), dtype=object)[:, None].repeat(length, axis=1)
    every = max(1, -(-layers // 12))
    fig = go.Figure(
        go.Heatmap(
            z=rows.astype(float),
            x=np.arange(length),
            y=np.arange(layers * kv_heads),
            zmin=0,
            zmax=2,
            colorscale=_state_scale(),
            customdata=np.stack([names, hover], axis=-1),
            showscale=False,
            ygap=1 if layers * kv_heads <= 40 else 0,
            hovertemplate="%{customdata[0]}<br>" + words["key"] + " %{x}<br>%{customdata[1]}<extra></extra>",
        )
    )
    ticks = list(range(0, layers, every))
    _state_legend(fig, words, (KEPT, EVICTED, OUTSIDE_WINDOW) if (kept == OUTSIDE_WINDOW).any() else (KEPT, EVICTED))
    fig.update_layout(
        yaxis=dict(
            autorange="reversed",
            title=words["evict_row"] if kv_heads > 1 else words["layer"],
            tickvals=[layer * kv_heads + (kv_heads - 1) / 2 for layer in ticks],
            ticktext=[str(layer) for layer in ticks],
            zeroline=False,
            showgrid=False,
        ),
        xaxis=dict(title=words["reach_axis"], range=[-0.5, length - 0.5], showgrid=False),
    )
    return finish(fig, title, large, height=first_screen_height(large))


def kept_over_steps_figure(
    history: np.ndarray, first_step: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """history: (passes, L) states of one (layer, KV head), NaN where a pass's position did not exist yet; row i is
    the pass that made answer token first_step + i."""
    passes, length = history.shape
    steps = [str(first_step + i) for i in range(passes)]
    fig = go.Figure(
        go.Heatmap(
            z=history,
            x=np.arange(length),
            y=steps,
            zmin=0,
            zmax=2,
            colorscale=_state_scale(),
            showscale=False,
            ygap=1 if passes <= 40 else 0,
            hovertemplate=words["evict_token_axis"] + " %{y}<br>" + words["key"] + " %{x}<extra></extra>",
        )
    )
    fig.update_layout(
        yaxis=dict(autorange="reversed", title=words["evict_token_axis"], type="category", nticks=min(passes, 16)),
        xaxis=dict(title=words["reach_axis"], range=[-0.5, length - 0.5]),
    )
    seen = tuple(int(v) for v in np.unique(history[np.isfinite(history)]))
    _state_legend(fig, words, tuple(s for s in (KEPT, EVICTED, OUTSIDE_WINDOW) if s in seen))
    return finish(fig, title, large, height=min(first_screen_height(large), 180 + 18 * passes))


def evicted_share_figure(
    share: np.ndarray, group: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """share: (layers, q_heads), the share full attention would put on the positions this pass did not read."""
    layers, q_heads = share.shape
    heads = [f"q{h} · kv{h // group}" for h in range(q_heads)]
    fig = go.Figure(
        go.Heatmap(
            z=share,
            x=heads,
            y=[str(i) for i in range(layers)],
            zmin=0.0,
            zmax=max(float(share.max()), 1e-6),
            colorscale=SEQUENTIAL,
            colorbar=dict(title=words["evict_share_short"], tickformat=".0%"),
            hovertemplate=words["layer"] + " %{y}<br>" + words["evict_head"] + " %{x}<br>%{z:.2%}<extra></extra>",
        )
    )
    fig.update_layout(
        yaxis=dict(autorange="reversed", title=words["layer"], type="category", nticks=min(layers, 24)),
        xaxis=dict(title=words["evict_head"], type="category"),
    )
    return finish(fig, title, large, height=first_screen_height(large))


def sink_figure(
    full: np.ndarray, evicting: np.ndarray, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """full, evicting: (layers,) each layer's attention on position 0, averaged over its Q heads, in the full
    cache's run and under the policy (the legend's names are short: a phone's legend stays on one line)."""
    layers = [str(i) for i in range(len(full))]
    fig = go.Figure(
        [
            go.Bar(
                x=layers,
                y=full,
                name=words["evict_full_cache"],
                marker_color=OKABE_ITO["grey"],
                hovertemplate=words["layer"] + " %{x}: %{y:.1%}<extra></extra>",
            ),
            go.Bar(
                x=layers,
                y=evicting,
                name=words["evict_under_policy"],
                marker_color=OKABE_ITO["blue"],
                hovertemplate=words["layer"] + " %{x}: %{y:.1%}<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        legend=TOP_LEGEND,
        yaxis=dict(title=words["evict_sink_axis"], tickformat=".0%", range=[0, 1]),
        xaxis=dict(title=words["layer"], type="category"),
    )
    return finish(fig, title, large, height=first_screen_height(large))


COST_COLORS = ("blue", "orange", "green", "purple", "sky", "vermillion")  # a policy's line, in the lab's order


def cost_figure(
    kl: dict[str, list[float | None]], chosen: str, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """kl: each policy's KL(full cache ‖ policy) of the next-token distribution, in nats, one value per answer token
    (None once its text parted from the full cache's: a gap). `chosen`, the page's policy, is drawn thicker."""
    fig = go.Figure()
    for i, (name, values) in enumerate(kl.items()):
        fig.add_trace(
            go.Scatter(
                x=list(range(1, len(values) + 1)),
                y=values,
                name=name,
                mode="lines+markers",
                connectgaps=False,
                line=dict(color=OKABE_ITO[COST_COLORS[i % len(COST_COLORS)]], width=4 if name == chosen else 1.5),
                marker=dict(size=7 if name == chosen else 4),
                hovertemplate=name + ", " + words["evict_token_axis"] + " %{x}: %{y:.4f}<extra></extra>",
            )
        )
    fig.update_layout(
        legend=TOP_LEGEND,
        yaxis=dict(title=words["evict_kl_axis"], rangemode="tozero"),
        xaxis=dict(title=words["evict_token_axis"], dtick=1 if max(map(len, kl.values())) <= 16 else None),
    )
    return finish(fig, title, large, height=first_screen_height(large))


def nll_by_position_figure(
    lines: dict[str, np.ndarray], cache: int, smooth: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """lines: name → NLL by position (entry p: the pass at p predicting the next token), each drawn as its mean over
    the latest `smooth` positions; a dotted line where the passes stop reading every position (`cache`)."""
    fig = go.Figure()
    colors = (OKABE_ITO["grey"], OKABE_ITO["vermillion"], OKABE_ITO["blue"], OKABE_ITO["green"])
    for i, (name, nll) in enumerate(lines.items()):
        means = np.convolve(nll, np.ones(smooth) / smooth, mode="valid")  # the mean of positions p − smooth + 1 … p
        fig.add_trace(
            go.Scatter(
                x=np.arange(smooth - 1, len(nll)),
                y=means,
                name=name,
                mode="lines",
                line=dict(color=colors[i % len(colors)], width=2.5 if i else 3, dash="dash" if i == 0 else None),
                hovertemplate=name + ": %{y:.2f}<extra></extra>",
            )
        )
    fig.add_vline(x=cache, line=dict(color=OKABE_ITO["black"], dash="dot", width=1))
    fig.update_layout(
        legend=TOP_LEGEND, yaxis=dict(title=words["evict_nll_axis"]), xaxis=dict(title=words["evict_position_axis"])
    )
    return finish(fig, title, large, height=first_screen_height(large))


def sinks_figure(
    sinks: list[int],
    as_written: list[float],
    inside: list[float],
    full: float,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """Mean NLL past the cache for each number of sinks: keys at the positions they were rotated at, and numbered
    inside the cache; the full cache's as a dashed line."""
    names = [str(n) for n in sinks]
    fig = go.Figure(
        [
            go.Bar(
                x=names,
                y=as_written,
                name=words["evict_positions_written"],
                marker_color=OKABE_ITO["orange"],
                hovertemplate="%{x}: %{y:.3f}<extra></extra>",
            ),
            go.Bar(
                x=names,
                y=inside,
                name=words["evict_positions_inside"],
                marker_color=OKABE_ITO["blue"],
                hovertemplate="%{x}: %{y:.3f}<extra></extra>",
            ),
        ]
    )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=[full] * len(names),
            name=words["evict_full_cache"],
            mode="lines",
            line=dict(color=OKABE_ITO["grey"], dash="dash", width=2),
            hovertemplate="%{y:.3f}<extra></extra>",
        )
    )  # in the legend: no label over a bar
    low = min(full, *as_written, *inside)
    fig.update_layout(
        barmode="group",
        legend=TOP_LEGEND,
        yaxis=dict(title=words["evict_nll_axis"], range=[0.9 * low, 1.02 * max(*as_written, *inside)]),
        xaxis=dict(title=words["evict_sinks_axis"], type="category"),
    )
    return finish(fig, title, large, height=first_screen_height(large))


def bytes_figure(
    full: int, allocated: int, kept: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """The cache's bytes three ways: without eviction, what the paged blocks hold (evicted rows are masked, not
    freed), and what the kept rows alone take (a cache that drops evicted rows, as kvpress's)."""
    names = [words["evict_bytes_full"], words["evict_bytes_allocated"], words["evict_bytes_kept"]]
    values = [full, allocated, kept]
    colors = [OKABE_ITO["grey"], OKABE_ITO["orange"], OKABE_ITO["blue"]]
    fig = go.Figure(
        go.Bar(
            y=names,
            x=values,
            orientation="h",
            marker_color=colors,
            text=[fmt_size(v) for v in values],
            textposition="auto",
            hoverinfo="skip",
        )
    )
    fig.update_layout(yaxis=dict(autorange="reversed"), xaxis=dict(title=words["evict_bytes_axis"]))
    return finish(fig, title, large, height=220 if not large else 260)


def text_comparison_html(common: str, full_rest: str, evicting_rest: str, policy: str, words: Words = ENGLISH) -> str:
    """The full cache's answer and the policy's, side by side in two rows, the shared start plain and each rest
    marked from the first token where they part ("same so far" when they have not)."""

    def row(label: str, rest: str, color: str) -> str:
        marked = f'<mark style="background:{color};color:#fff;padding:0 2px">{html.escape(rest)}</mark>' if rest else ""
        return (
            f'<div style="margin:0.2rem 0"><b>{html.escape(label)}</b> '
            f'<span style="white-space:pre-wrap">{html.escape(common)}</span>{marked}</div>'
        )

    rows = row(words["evict_full_cache"] + ":", full_rest, "#555555") + row(
        policy + ":", evicting_rest, OKABE_ITO["vermillion"]
    )
    return f'<div class="kv-evict-text">{rows}</div>'
