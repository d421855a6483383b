"""One token in two contexts (engine/context_kv.py): how alike its two keys and its two values are, layer by
layer."""

from __future__ import annotations

import plotly.graph_objects as go

from viz.style import OKABE_ITO, TOP_LEGEND, finish, first_screen_height
from viz.words import ENGLISH, Words


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
