"""The step picture's pieces (Box, Arrow, Label) and how each becomes Plotly shapes and annotations: the
highlighted stage lit, the others dimmed yet readable on a projector, every shape named by its stage."""

from __future__ import annotations

from dataclasses import dataclass

from viz.style import OKABE_ITO

HIGHLIGHT = OKABE_ITO["vermillion"]
LINE = "#555555"
# Dimmed parts stay readable on a projector: dark grey text (contrast 6.7 on white), grey lines, paler fills.
DIMMED_LINE, DIMMED_TEXT, DIMMED_OPACITY = "#8c8c8c", "#5c5c5c", 0.6
FILLS = {  # a light fill per part of the model: input side, layers, cache, output side
    "token_id": "#dcefff",
    "embedding": "#dcefff",
    "next_input": "#dcefff",
    "attention": "#e3f4ec",
    "ffn": "#e3f4ec",
    "residual": "#ffffff",
    "kv_write": "#fff6cc",
    "kv_read": "#fff6cc",
    "final_norm": "#fde9d9",
    "lm_head": "#fde9d9",
    "sampling": "#fde9d9",
    "detokenize": "#fde9d9",
}
FRAME = "frame"  # the layers' frame: part of no stage, never highlighted or dimmed
PAD = 4  # px between a box's edge and its text
STACK_SHADOWS = 2  # copies drawn behind a box when several tokens go through at once (prefill)
SHADOW_X, SHADOW_Y = 0.4, 3  # how far each copy sits up and right (x units, px)
HEAD_LENGTH, HEAD_HALF_WIDTH = 7.2, 3.0  # an arrow's head, in its line's widths


@dataclass(frozen=True)
class Box:
    stage: str
    x0: float
    y0: float
    x1: float
    y1: float
    text: str  # Plotly text: lines joined by <br>
    per_token: bool = False  # drawn as a deck of rows when the step feeds several tokens (prefill)
    round: bool = False  # a ⊕ node
    text_on_top: bool = False  # text at the top, leaving the bottom for a shape label


@dataclass(frozen=True)
class Arrow:
    stage: str
    points: tuple[tuple[float, float], ...]  # a polyline; the head is at the last point


@dataclass(frozen=True)
class Label:
    stage: str
    x: float
    y: float
    text: str
    key: str = ""  # the flow row whose shape this label shows ("" for other words)
    align: str = "center"  # which side of (x, y) the text starts: "left", "center" or "right"


def _style(part_stage: str, stage: str | None) -> tuple[str, float, float, str]:
    """(line colour, line width, opacity, text colour) of a part when `stage` is highlighted (None: none)."""
    if stage is None or part_stage == FRAME:
        return LINE, 1.5, 1.0, "#222222"
    if part_stage == stage:
        return HIGHLIGHT, 4.0, 1.0, "#000000"
    return DIMMED_LINE, 1.0, DIMMED_OPACITY, DIMMED_TEXT


@dataclass
class Drawing:
    """The figure's shapes and annotations (plotly layout dicts), collected before they are set."""

    shapes: list[dict]
    annotations: list[dict]


def draw(fig: Drawing, part, stage: str | None, text: int, size: int, deck: int) -> None:
    """Add one Box, Arrow or Label to `fig`, styled for the highlighted `stage`, its words `text` px (a ⊕ sign
    `size`); a per-token box gets `deck` copies behind it."""
    color, width, opacity, text_color = _style(part.stage, stage)
    if isinstance(part, Box):
        draw_box(fig, part, color, width, opacity, text_color, size if part.round else text, stage == part.stage, deck)
    elif isinstance(part, Arrow):
        draw_arrow(fig, part, color, width, opacity)
    else:
        anchor = {"left": "left", "right": "right"}.get(part.align, "center")
        fig.annotations.append(
            dict(
                x=part.x,
                y=part.y,
                text=part.text,
                showarrow=False,
                xanchor=anchor,
                align=part.align,
                font=dict(size=text, color=text_color),
                bgcolor="rgba(255,255,255,0.85)",
                name=f"{part.stage}:shape:{part.key}" if part.key else part.stage,
            )
        )


def draw_box(
    fig: Drawing, box: Box, color: str, width: float, opacity: float, text_color: str, text: int, lit: bool, deck: int
) -> None:
    """A box (or ⊕ circle) with its words (`text` px); `deck` copies behind it stand for the other rows of a
    prefill."""
    fill = "#ffd9bf" if lit else FILLS.get(box.stage, "white")
    kind = "circle" if box.round else "rect"
    if box.per_token:
        for k in range(deck, 0, -1):  # the rows behind the front one
            fig.shapes.append(
                dict(
                    type=kind,
                    x0=box.x0 + SHADOW_X * k,
                    x1=box.x1 + SHADOW_X * k,
                    y0=box.y0 + SHADOW_Y * k,
                    y1=box.y1 + SHADOW_Y * k,
                    line=dict(color=color, width=1),
                    fillcolor=fill,
                    opacity=opacity,
                    name=box.stage,
                    layer="below",
                )
            )
    fig.shapes.append(
        dict(
            type=kind,
            x0=box.x0,
            x1=box.x1,
            y0=box.y0,
            y1=box.y1,
            line=dict(color=color, width=width),
            fillcolor=fill if box.text else "rgba(0,0,0,0)",
            opacity=opacity,
            name=box.stage,
            layer="below",
        )
    )
    if box.text:
        y, anchor = (box.y1 - PAD, "top") if box.text_on_top else ((box.y0 + box.y1) / 2, "middle")
        fig.annotations.append(
            dict(
                x=(box.x0 + box.x1) / 2,
                y=y,
                yanchor=anchor,
                text=box.text,
                showarrow=False,
                font=dict(size=text, color=text_color),
                name=box.stage,
            )
        )


def draw_arrow(fig: Drawing, arrow: Arrow, color: str, width: float, opacity: float) -> None:
    """The polyline as one path shape, and its head: a triangle at the last point, pointing along the last segment
    (horizontal or vertical), sized in px. Plotly's own arrow head is an annotation's, and the browser drew the
    picture's 16 of them in about a third of its time (bench/figure_draw.py)."""
    points = arrow.points
    line_width = max(width - 1, 1.5)
    path = "M " + " L ".join(f"{x},{y}" for x, y in points)
    fig.shapes.append(
        dict(type="path", path=path, line=dict(color=color, width=line_width), opacity=opacity, name=arrow.stage)
    )
    (tail_x, tail_y), (head_x, head_y) = points[-2], points[-1]
    along = (1 if head_x > tail_x else -1, 0) if tail_y == head_y else (0, 1 if head_y > tail_y else -1)
    length, half = HEAD_LENGTH * line_width, HEAD_HALF_WIDTH * line_width  # px: as Plotly's arrowhead 2 at size 1.2
    base_x, base_y = -along[0] * length, -along[1] * length
    side_x, side_y = -along[1] * half, along[0] * half
    fig.shapes.append(
        dict(
            type="path",
            xsizemode="pixel",
            ysizemode="pixel",
            xanchor=head_x,
            yanchor=head_y,
            path=f"M 0,0 L {base_x + side_x:g},{base_y + side_y:g} L {base_x - side_x:g},{base_y - side_y:g} Z",
            fillcolor=color,
            line=dict(width=0),
            opacity=opacity,
            name=arrow.stage,
        )
    )
