"""A picture of one step: the token's trip from its id through the embedding, every layer (attention with
the paged KV cache, FFN, two residual adds), the final norm, lm_head and sampling to the new id, and the
id's two paths (text for the user; embedding row for the next step). Every arrow carries the real shape,
read from `viz.flow.flow_rows` (the flow table's rows), so the table and the picture cannot disagree.

Drawn with Plotly shapes and annotations on a fixed 100 × 100 canvas (x right, y up). A lesson chapter
highlights one stage; every shape and annotation is named by its stage ("<stage>", or
"<stage>:shape:<flow row key>" for a label that shows a shape) so tests and readers can find it. An arrow
belongs to the stage that produces what it carries (the logits arrow to lm_head, the new id's arrows to the path
they start).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from engine.model import ModelInfo
from engine.trace import StepTrace
from viz.flow import FlowRow, flow_rows
from viz.style import OKABE_ITO, finish, fmt_int, fmt_percent, plotly_text
from viz.tokens import visible
from viz.words import ENGLISH, Words

# The stages of one step, in the order the token meets them; lesson chapters name the one they talk about.
STAGES = ("token_id", "embedding", "attention", "kv_write", "kv_read", "ffn", "residual", "final_norm", "lm_head",
          "sampling", "detokenize", "next_input")

HIGHLIGHT = OKABE_ITO["vermillion"]
LINE = "#555555"
DIMMED_TEXT = "#b0b0b0"
FILLS = {  # a light fill per part of the model: input side, layers, cache, output side
    "token_id": "#dcefff", "embedding": "#dcefff", "next_input": "#dcefff",
    "attention": "#e3f4ec", "ffn": "#e3f4ec", "residual": "#ffffff",
    "kv_write": "#fff6cc", "kv_read": "#fff6cc",
    "final_norm": "#fde9d9", "lm_head": "#fde9d9", "sampling": "#fde9d9", "detokenize": "#fde9d9",
}
FRAME = "frame"  # the layers' frame and the phase note: part of no stage, never highlighted or dimmed
BOX_TEXT, LABEL_TEXT = 0.9, 0.82  # of the page's figure text size: boxes are narrow, labels sit between them
STACK_SHADOWS = 2  # copies drawn behind a box when several tokens go through at once (prefill)


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


def step_figure(trace: StepTrace, info: ModelInfo, stage: str | None = None, title: str = "", large: bool = False,
                words: Words = ENGLISH) -> go.Figure:
    """The step of `trace` as one diagram; `stage` (one of STAGES, or None) is highlighted, the rest dimmed.

    Shapes on the arrows come from `flow_rows(trace, info)`: e.g. (1, 576) into the layers in decode,
    (n, 576) in prefill, logits (vocab,), the embedding row (hidden,) for the next step.
    """
    if stage is not None and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    rows = {row.key: row for row in flow_rows(trace, info)}
    parts = input_band(trace, info, rows, words) + layer_band(rows, words) + \
        output_band(trace, info, rows, words)
    fig = finish(go.Figure(), title, large, height=660 if large else 560)
    size = fig.layout.font.size  # the shared figure text size (larger for a projector)
    deck = STACK_SHADOWS if len(trace.input_ids) > 1 else 0
    for part in parts:
        draw(fig, part, stage, size, deck)
    fig.update_xaxes(range=[0, 100], visible=False, fixedrange=True)
    fig.update_yaxes(range=[0, 100], visible=False, fixedrange=True)
    fig.update_layout(showlegend=False, plot_bgcolor="white", hovermode=False)
    return fig


def shape_label(row: FlowRow, x: float, y: float, align: str = "center", prefix: str = "") -> Label:
    """A label showing `row`'s shape (its stage's colour when highlighted)."""
    return Label(row.stage, x, y, prefix + row.shape, key=row.key, align=align)


def input_band(trace: StepTrace, info: ModelInfo, rows: dict[str, FlowRow], words: Words) -> list:
    """Top left: the id(s) and their embedding rows; top right: what this step feeds and reads, in words."""
    t = len(trace.input_ids)
    shown = ", ".join(str(i) for i in trace.input_ids[:2]) + (", …" if t > 2 else "")
    ids_text = words["sp_token_ids" if t > 1 else "sp_token_id"].format(n=t) + "<br>" + shown + "<br>" + \
        words["sp_positions" if t > 1 else "sp_position"].format(positions=rows["ids"].facts["positions"])
    embed_text = words["sp_embedding"] + "<br>" + words["sp_embedding_rows"].format(
        vocab=fmt_int(info.vocab), hidden=info.hidden)
    if "positions" in rows:  # GPT-2: a learned row per position is added (wpe)
        embed_text += "<br>" + words["sp_position_rows"]
    note = words["sp_prefill_note" if trace.phase == "prefill" else "sp_decode_note"].format(
        n=t, positions=rows["ids"].facts["positions"], position=trace.positions[-1], layers=info.layers,
        length=rows["read_kv"].facts["length"])
    parts = [
        Box("token_id", 1, 84, 19, 98, ids_text, per_token=True),
        Arrow("token_id", ((10, 84), (10, 77))),
        shape_label(rows["ids"], 11, 81, "left"),
        Box("embedding", 1, 60, 19, 77, embed_text, per_token=True),
        Label(FRAME, 24, 91, note, align="left"),
    ]
    if "positions" in rows:  # the position table's name in GPT-2's weights
        parts.append(shape_label(rows["positions"], 10, 56.5, prefix="+ wpe "))
    return parts


def layer_band(rows: dict[str, FlowRow], words: Words) -> list:
    """The layer, drawn once for all N: x0 → norm, q/k/v → attention (via the paged cache) → ⊕ → norm, FFN → ⊕,
    with the residual (skip) lines above the row and the cache below it."""
    row_y0, row_y1, mid = 53, 65, 59
    skip_y = 70
    layers = rows["residual"].facts
    return [
        Box(FRAME, 22, 33.5, 99, 79, ""),  # one layer drawn stands for all N
        Label("residual", 23, 76, words["sp_layers"].format(layers=layers["layers"], adds=layers["adds"]),
              align="left"),
        Arrow("embedding", ((19, mid), (27, mid))),
        shape_label(rows["embed"], 23, 62.5, "center", "x0 "),
        Box("attention", 27, row_y0, 40, row_y1, words["sp_norm_qkv"], per_token=True),
        Arrow("attention", ((40, 61), (55, 61))),
        shape_label(rows["q"], 47.5, 63.5),
        Box("attention", 55, row_y0, 69, row_y1, words["sp_attend"], per_token=True),
        # K and V go down into the cache; attention reads the whole cache back up.
        Arrow("kv_write", ((33.5, row_y0), (33.5, 48))),
        Box("kv_write", 27, 34.5, 45, 48, words["sp_cache_write"], text_on_top=True),
        shape_label(rows["write_kv"], 36, 37),
        Box("kv_read", 45, 34.5, 63, 48, words["sp_cache_read"].format(length=rows["read_kv"].facts["length"]),
            text_on_top=True),
        shape_label(rows["read_kv"], 54, 37),
        Arrow("kv_read", ((60, 48), (60, row_y0))),
        Arrow("attention", ((69, mid), (74, mid))),
        Box("residual", 74, mid - 2, 78, mid + 2, "+", round=True),
        Box("ffn", 80.5, row_y0, 92, row_y1, words["sp_ffn"], per_token=True),
        Arrow("residual", ((78, mid), (80.5, mid))),
        shape_label(rows["mlp"], 86, 50.5),
        Arrow("ffn", ((92, mid), (94, mid))),
        Box("residual", 94, mid - 2, 98, mid + 2, "+", round=True),
        # The skip lines: x0 around attention onto x1, x1 around the FFN onto x2.
        Arrow("residual", ((24, mid), (24, skip_y), (76, skip_y), (76, mid + 2))),
        Label("residual", 50, skip_y + 2.5, words["sp_add_attention"]),
        Arrow("residual", ((79, mid), (79, skip_y), (96, skip_y), (96, mid + 2))),
        Label("residual", 87.5, skip_y + 2.5, words["sp_add_ffn"]),
    ]


def output_band(trace: StepTrace, info: ModelInfo, rows: dict[str, FlowRow], words: Words) -> list:
    """Bottom: the last position's x2 → final norm → lm_head → logits → softmax and filters → the new id, which
    takes two paths: its text to the user, its embedding row to the next step."""
    drawn = next((c for c in trace.candidates if c.token_id == trace.token_id), None)
    chance = "<br>" + words["sp_chance"].format(p=fmt_percent(drawn.p_top_p)) if drawn else ""
    piece = plotly_text(visible(trace.text))
    last = words["sp_last_position"].format(position=trace.positions[-1])
    return [
        Arrow("final_norm", ((96, 57), (96, 30.5), (8, 30.5), (8, 25))),
        Label("final_norm", 52, 32.2, last + ": x2 " + rows["final_norm"].shape, key="final_norm"),
        Box("final_norm", 1, 13, 15, 25, words["sp_final_norm"]),
        Arrow("final_norm", ((15, 19), (22, 19))),
        shape_label(rows["final_norm"], 18.5, 22),
        Box("lm_head", 22, 13, 34, 25, words["sp_lm_head"].format(vocab=fmt_int(info.vocab), hidden=info.hidden)),
        Arrow("lm_head", ((34, 19), (44, 19))),
        shape_label(rows["lm_head"], 39, 22, prefix=words["sp_logits"] + "<br>"),
        Box("sampling", 44, 9, 66, 28, words["sp_sampling"] + chance),
        Arrow("sampling", ((66, 19), (70, 19))),
        Box("sampling", 70, 12, 80, 26, words["sp_new_id"].format(id=trace.token_id) + f"<br>“{piece}”"),
        Arrow("detokenize", ((80, 22), (83, 22), (83, 21), (86, 21))),
        Box("detokenize", 86, 15, 99.5, 27, words["sp_detokenize"].format(piece=piece)),
        Arrow("next_input", ((80, 16), (83, 16), (83, 7), (86, 7))),
        Box("next_input", 86, 1, 99.5, 13, words["sp_next_input"].format(
            id=trace.token_id, position=trace.positions[-1] + 1)),
        shape_label(rows["next_input"], 82.5, 3, "right", prefix=words["sp_row"] + " "),
    ]


def _style(part_stage: str, stage: str | None) -> tuple[str, float, float, str]:
    """(line colour, line width, opacity, text colour) of a part when `stage` is highlighted (None: none)."""
    if stage is None or part_stage == FRAME:
        return LINE, 1.5, 1.0, "#222222"
    if part_stage == stage:
        return HIGHLIGHT, 4.0, 1.0, "#000000"
    return "#c8c8c8", 1.0, 0.45, DIMMED_TEXT


def draw(fig: go.Figure, part, stage: str | None, size: int, deck: int) -> None:
    """Add one Box, Arrow or Label to `fig`, styled for the highlighted `stage`; a per-token box gets `deck`
    copies behind it."""
    color, width, opacity, text_color = _style(part.stage, stage)
    if isinstance(part, Box):
        draw_box(fig, part, color, width, opacity, text_color, size, stage == part.stage, deck)
    elif isinstance(part, Arrow):
        draw_arrow(fig, part, color, width, opacity)
    else:
        anchor = {"left": "left", "right": "right"}.get(part.align, "center")
        fig.add_annotation(x=part.x, y=part.y, text=part.text, showarrow=False, xanchor=anchor, align=part.align,
                           font=dict(size=round(LABEL_TEXT * size), color=text_color), bgcolor="rgba(255,255,255,0.85)",
                           name=f"{part.stage}:shape:{part.key}" if part.key else part.stage)


def draw_box(fig: go.Figure, box: Box, color: str, width: float, opacity: float, text_color: str, size: int,
             lit: bool, deck: int) -> None:
    """A box (or ⊕ circle) with its text; `deck` copies behind it stand for the other rows of a prefill."""
    fill = "#ffd9bf" if lit else FILLS.get(box.stage, "white")
    kind = "circle" if box.round else "rect"
    if box.per_token:
        for k in range(deck, 0, -1):  # the rows behind the front one
            fig.add_shape(type=kind, x0=box.x0 + 0.6 * k, x1=box.x1 + 0.6 * k, y0=box.y0 + 1.2 * k,
                          y1=box.y1 + 1.2 * k, line=dict(color=color, width=1), fillcolor=fill, opacity=opacity,
                          name=box.stage, layer="below")
    fig.add_shape(type=kind, x0=box.x0, x1=box.x1, y0=box.y0, y1=box.y1, line=dict(color=color, width=width),
                  fillcolor=fill if box.text else "rgba(0,0,0,0)", opacity=opacity, name=box.stage, layer="below")
    if box.text:
        y, anchor = (box.y1 - 0.8, "top") if box.text_on_top else ((box.y0 + box.y1) / 2, "middle")
        fig.add_annotation(x=(box.x0 + box.x1) / 2, y=y, yanchor=anchor, text=box.text, showarrow=False,
                           font=dict(size=size if box.round else round(BOX_TEXT * size), color=text_color), name=box.stage)


def draw_arrow(fig: go.Figure, arrow: Arrow, color: str, width: float, opacity: float) -> None:
    """The polyline as one path shape, and the last segment as an annotation arrow (for its head)."""
    points = arrow.points
    path = "M " + " L ".join(f"{x},{y}" for x, y in points)
    fig.add_shape(type="path", path=path, line=dict(color=color, width=max(width - 1, 1.5)),
                  opacity=opacity, name=arrow.stage)
    (tail_x, tail_y), (head_x, head_y) = points[-2], points[-1]
    fig.add_annotation(x=head_x, y=head_y, ax=tail_x, ay=tail_y, xref="x", yref="y", axref="x", ayref="y", text="",
                       showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=max(width - 1, 1.5), arrowcolor=color,
                       opacity=opacity, name=arrow.stage)
