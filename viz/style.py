"""Shared look: colour-blind-safe colours (Okabe–Ito) and scales, and projector-sized text."""

from __future__ import annotations

import plotly.graph_objects as go

OKABE_ITO = {
    "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999", "black": "#000000",
}
PROMPT_COLOR = OKABE_ITO["sky"]
GENERATED_COLOR = OKABE_ITO["orange"]
NEWEST_COLOR = OKABE_ITO["vermillion"]
HIT_COLOR = OKABE_ITO["green"]
MISS_COLOR = OKABE_ITO["grey"]
SEQUENTIAL = "Viridis"  # perceptually uniform and colour-blind safe
DIVERGING = "RdBu"


MAX_POSITIONS = 160  # per axis: beyond this a chart shows the latest positions only


def window(n: int, size: int = MAX_POSITIONS) -> slice:
    """The latest `size` of n positions (all of them when they fit)."""
    return slice(max(0, n - size), n)


def position_ticks(labels: list[str], shown: slice) -> list[str]:
    """Axis labels "position:token" for the positions in `shown`."""
    return [f"{i}:{labels[i]}" for i in range(shown.start, shown.stop)]


def finish(fig: go.Figure, title: str = "", large: bool = False, height: int | None = None) -> go.Figure:
    """Common layout; `large` scales text for a projector."""
    size = 18 if large else 13
    fig.update_layout(
        title=dict(text=title, font=dict(size=size + 3)),
        font=dict(size=size),
        margin=dict(l=10, r=10, t=50 if title else 20, b=10),
        template="plotly_white",
    )
    if height:
        fig.update_layout(height=height)
    return fig
