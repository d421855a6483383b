"""Shared look: colour-blind-safe colours (Okabe–Ito) and scales, and projector-sized text."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "grey": "#999999",
    "black": "#000000",
}
PROMPT_COLOR = OKABE_ITO["sky"]
GENERATED_COLOR = OKABE_ITO["orange"]
NEWEST_COLOR = OKABE_ITO["vermillion"]
HIT_COLOR = OKABE_ITO["green"]
MISS_COLOR = OKABE_ITO["grey"]
SEQUENTIAL = "Viridis"  # perceptually uniform and colour-blind safe
DIVERGING = "RdBu"


MAX_POSITIONS = 160  # per axis: beyond this a chart shows the latest positions only
MOST_TICKS = 24  # per axis: more labels than this read as a smear, and Plotly lays each one out in the browser
MOST_LABELLED = 48  # cells (blocks, bars) a chart writes on; beyond, its colours and hover tell (block size 1)


def window(n: int, size: int = MAX_POSITIONS) -> slice:
    """The latest `size` of n positions (all of them when they fit)."""
    return slice(max(0, n - size), n)


def tick_step(count: int, unit: int = 1) -> int:
    """An axis' tick step over `count` positions: a multiple of `unit` (a block), as small as keeps at most
    MOST_TICKS ticks."""
    return unit * max(1, math.ceil(count / unit / MOST_TICKS))


def position_ticks(labels: list[str], shown: slice) -> list[str]:
    """Axis labels "position:token" for the positions in `shown`."""
    return [f"{i}:{plotly_text(labels[i])}" for i in range(shown.start, shown.stop)]


def plotly_text(text: str) -> str:
    """A token's text inside a Plotly label, shown as text: Plotly reads tags such as <a href>, <b>, <br>
    in labels, and decodes entities, so escaping < > & keeps a typed or generated token literal."""
    return html.escape(text, quote=False)


def first_screen_height(large: bool = False) -> int:
    """Pixels for a view's main figure: what is left of a 1280×720 projector's first screen below the page's
    header, step buttons and token stream (they take more room with large text)."""
    return 380 if large else 440


# A legend in one row above the plot: under it, a horizontal legend sat on the x axis's title and ticks (the
# residual chart's "layer", the block pool's numbers). Plotly widens the top margin to fit it.
TOP_LEGEND = dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom")
TOP_MARGIN = 20  # px above the plot: room for what sits there (subplot titles, the top row of a heatmap's labels)
TITLE_ROOM = 30  # px more for a title drawn by Plotly


def untitled(fig: go.Figure) -> go.Figure:
    """`fig` without its title (changed in place, a copy costs tens of ms; returned), for a page that shows the
    title as text above it (text wraps; a Plotly title does not, and was cut at a projector's large text and on a
    phone). The top margin loses the title's room, and the height with it, so the plot keeps its size."""
    top = fig.layout.margin.t
    if top is None:
        return fig.update_layout(title=dict(text=""))
    new_top = max(4, top - TITLE_ROOM)
    changes = dict(title=dict(text=""), margin=dict(t=new_top))  # one update: each is a pass of Plotly's checks
    if fig.layout.height:
        changes["height"] = fig.layout.height - (top - new_top)
    return fig.update_layout(**changes)


# Every figure is drawn on plotly_white's layout. Its per-trace defaults are left out (each trace here sets its own
# colours) and it is the default template, so a figure starts with it instead of validating a whole template each
# time (10 ms a figure, several a step), and sends a third of the bytes to each browser.
pio.templates["kvscope"] = go.layout.Template(layout=pio.templates["plotly_white"].layout)
pio.templates.default = "kvscope"


def finish(fig: go.Figure, title: str = "", large: bool = False, height: int | None = None) -> go.Figure:
    """Common layout; `large` scales text for a projector."""
    size = 18 if large else 13
    fig.update_layout(
        title=dict(text=title, font=dict(size=size + 3)),
        font=dict(size=size),
        margin=dict(l=10, r=10, t=TOP_MARGIN + (TITLE_ROOM if title else 0), b=10),
    )
    if height:
        fig.update_layout(height=height)
    return fig


# -- colours per K/V head -------------------------------------------------------------------------

# Okabe–Ito, most distinct first: up to 8 KV heads get 8 colours a colour-blind reader can tell apart.
KV_HEAD_COLORS = [OKABE_ITO[c] for c in ("blue", "orange", "green", "vermillion", "sky", "purple", "yellow", "black")]


def kv_head_color(kv_head: int) -> str:
    """The colour of one K/V head (and of the Q heads that read it), the same in every chart."""
    return KV_HEAD_COLORS[kv_head % len(KV_HEAD_COLORS)]


def relative_luminance(color: str) -> float:
    """WCAG relative luminance of "#rrggbb" or "rgb(r, g, b)", 0 (black) to 1 (white)."""
    if color.startswith("#"):
        channels = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    else:
        channels = [float(x) for x in color[color.index("(") + 1 : color.index(")")].split(",")[:3]]
    linear = [(c / 255) / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours, 1 to 21 (4.5 is enough for normal text)."""
    high, low = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def text_color_on(background: str) -> str:
    """Black or white, whichever reads better on `background`."""
    return "#000000" if contrast_ratio(background, "#000000") >= contrast_ratio(background, "#ffffff") else "#ffffff"


# -- numbers for people ---------------------------------------------------------------------------


def fmt_int(n) -> str:
    """12345 → "12,345"."""
    return f"{int(n):,}"


def fmt_float(x, decimals: int = 3) -> str:
    """A float with thousands separators and `decimals` decimals; missing or infinite values as "–"."""
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{float(x):,.{decimals}f}"


def fmt_ms(x) -> str:
    """Milliseconds: 2 decimals below 10 ms, 1 below 1,000 ms, none above."""
    x = float(x)
    return f"{x:,.{2 if x < 10 else 1 if x < 1000 else 0}f} ms"


def fmt_percent(p) -> str:
    """A probability as a percentage: 2 decimals below 10 %, 1 above."""
    value = 100 * float(p)
    return f"{value:.{2 if value < 10 else 1}f}%"


def fmt_probability(p) -> str:
    """As `fmt_percent`, but a probability too small for it is "< 0.01%", and only 0 itself is "0%": a guess the
    model gives 3e-7 is not one it rules out."""
    if float(p) == 0:
        return "0%"
    return "< 0.01%" if float(p) < 0.00005 else fmt_percent(p)


def fmt_size(n) -> str:
    """Bytes with a binary prefix: 114688 → "112 KiB", 114688000 → "109.4 MiB"."""
    n = int(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.{0 if n % size == 0 else 1}f} {unit}"
    return f"{n:,} B"


def fmt_bytes(n) -> str:
    """Exact bytes with separators, and the size: 114688 → "114,688 B (112 KiB)"."""
    n = int(n)
    return f"{n:,} B" if n < 2**10 else f"{n:,} B ({fmt_size(n)})"


def readable(
    frame: pd.DataFrame, words: Mapping[str, str], formats: Mapping[str, Callable] | None = None
) -> pd.DataFrame:
    """A table for people: each column's values through `formats[column]` (when given), and its header
    `words[column]` (the column's own name when the words have none)."""
    formats = formats or {}
    out = pd.DataFrame(
        {column: frame[column].map(formats[column]) if column in formats else frame[column] for column in frame.columns}
    )
    return out.rename(columns={c: words.get(c, c) for c in frame.columns})


def check_mark(value: bool) -> str:
    """A yes/no cell in any language: ✓ or empty."""
    return "✓" if value else ""
