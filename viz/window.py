"""What every layer reads at one step: the newest query's attention over all cached positions, one row per layer,
so a sliding-window layer's row (blank before its window) sits beside a global layer's (reaching back to 0)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from viz.style import OKABE_ITO, SEQUENTIAL, finish, first_screen_height
from viz.words import ENGLISH, Words


def layer_reach_frame(probs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """(layers, L) probabilities of the newest query, NaN where its layer never read the key: where the engine's
    score is −inf (the causal mask, and a local layer's keys before its window)."""
    reach = np.array(probs, dtype=float)
    reach[~np.isfinite(np.asarray(scores, dtype=float))] = np.nan
    return reach


def layer_reach_figure(
    reach: np.ndarray,
    kinds: tuple[str, ...],
    window_start: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """`layer_reach_frame` drawn: rows are layers (named with their kind), columns positions 0 … L − 1, blank where
    the layer did not read. `window_start`: the first position the local layers' cache still holds (a dashed line
    where blocks before it went back to the pool; none while it is 0)."""
    layers, length = reach.shape
    names = [f"{layer} · {words['kind_short_' + kind]}" for layer, kind in enumerate(kinds)]
    finite = reach[np.isfinite(reach)]
    top = float(np.quantile(finite, 0.99)) if finite.size else 1.0  # a few sink keys would wash the rest out
    fig = go.Figure(
        go.Heatmap(
            z=reach,
            x=np.arange(length),
            y=names,
            colorscale=SEQUENTIAL,
            zmin=0.0,
            zmax=max(top, 1e-6),
            colorbar=dict(title="p"),
            hovertemplate=words["layer"] + " %{y}<br>" + words["key"] + " %{x}<br>p = %{z:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        yaxis=dict(autorange="reversed", title=words["layer"], type="category"),
        xaxis=dict(title=words["reach_axis"], range=[-0.5, length - 0.5]),
    )
    if window_start:
        fig.add_vline(x=window_start - 0.5, line=dict(color=OKABE_ITO["vermillion"], width=3, dash="dash"))
        fig.add_annotation(
            x=0,
            y=1,
            xref="paper",
            yref="paper",
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            font=dict(color=OKABE_ITO["vermillion"]),
            text=words["reach_returned"].format(first=0, last=f"{window_start - 1:,}"),
        )
    return finish(fig, title, large, height=first_screen_height(large))
