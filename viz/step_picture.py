"""A picture of one step: the token's trip from its id through the embedding, every layer (attention with
the paged KV cache, FFN, two residual adds), the final norm, lm_head and sampling to the new id, and the
id's two paths (text for the user; embedding row for the next step). Every arrow carries the real shape,
read from `viz.flow.flow_rows` (the flow table's rows), so the table and the picture cannot disagree.

Wider than tall, to fit a projector's first screen: the ids and their embedding rows in a column left of the
layer, the output row (final norm → … → the two paths) under both. Drawn with Plotly shapes and annotations on a
canvas 100 units wide (x right) whose heights are px measured in lines of text (y up, see Rows). A lesson chapter
highlights one stage; every shape and annotation is named by its stage ("<stage>", or
"<stage>:shape:<flow row key>" for a label that shows a shape) so tests and readers can find it. An arrow
belongs to the stage that produces what it carries (the logits arrow to lm_head, the new id's arrows to the path
they start).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from engine.model_info import ModelInfo
from engine.trace import StepTrace
from viz.flow import FlowRow, flow_rows
from viz.step_drawing import FRAME, PAD, SHADOW_Y, STACK_SHADOWS, Arrow, Box, Drawing, Label, draw
from viz.style import finish, fmt_int, fmt_percent, plotly_text
from viz.tokens import visible
from viz.words import ENGLISH, Words

# The stages of one step, in the order the token meets them; lesson chapters name the one they talk about.
STAGES = (
    "token_id",
    "embedding",
    "attention",
    "kv_write",
    "kv_read",
    "ffn",
    "residual",
    "final_norm",
    "lm_head",
    "sampling",
    "detokenize",
    "next_input",
)

TEXT, MIN_TEXT = 0.9, 13  # every word: this share of the page's figure text size, and never under 13 px
LINE_SPACING = 1.3  # Plotly's line height, in text sizes
MIN_WIDTH = 760  # px the picture needs (its x axis is 100 units wide, its words fixed px): large text still fits


@dataclass(frozen=True)
class Rows:
    """Heights on the canvas in px (y up, 0 at the bottom of the plot area), all measured in lines of text, so a
    larger text size makes a taller picture rather than overlapping words. From the bottom: the output row (the
    two paths stacked at its right end), the gap x2 crosses to the final norm, and the layer (the skip lines with
    their labels, the row of boxes, the paged cache above it)."""

    line: float  # px per line of text
    row_lines: int = 2  # lines the row of boxes holds (3 where each branch's output is normalised too: Gemma 3)

    def box(self, lines: int) -> float:
        """The height of a box holding `lines` lines of text."""
        return lines * self.line + 2 * PAD

    def labelled_box(self, lines: int) -> float:
        """The height of a box holding `lines` lines of text over a shape label (with a gap between them)."""
        return self.box(lines + 1) + PAD

    @property
    def out_top(self) -> float:
        return self.box(2) + 6 + self.box(3)  # detokenize over next input

    @property
    def out_mid(self) -> float:
        return self.out_top / 2

    @property
    def link(self) -> float:  # the line carrying the last position's x2 under the layer
        return self.out_top + self.line / 2 + 3

    @property
    def layer_bottom(self) -> float:
        return self.out_top + self.line + 6

    @property
    def skip(self) -> float:  # the skip (residual) lines, with their labels under them
        return self.layer_bottom + self.line + 6

    @property
    def row_bottom(self) -> float:
        return self.skip + 10

    @property
    def row_top(self) -> float:
        return self.row_bottom + self.box(self.row_lines)

    @property
    def mid(self) -> float:  # the residual stream's height through the row of boxes
        return (self.row_bottom + self.row_top) / 2

    @property
    def cache_bottom(self) -> float:
        return self.row_top + 16  # room for the K, V arrows

    @property
    def cache_top(self) -> float:
        return self.cache_bottom + self.labelled_box(2)

    @property
    def layer_top(self) -> float:
        return self.cache_top + 4

    @property
    def height(self) -> float:
        return self.layer_top + STACK_SHADOWS * SHADOW_Y + 2  # room for the token box's deck


def step_figure(
    trace: StepTrace,
    info: ModelInfo,
    stage: str | None = None,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """The step of `trace` as one diagram; `stage` (one of STAGES, or None) is highlighted, the rest dimmed.

    Shapes on the arrows come from `flow_rows(trace, info)`: e.g. (1, 576) into the layers in decode,
    (n, 576) in prefill, logits (vocab,), the embedding row (hidden,) for the next step. About 330 px high with
    a title and normal text, 385 with large; it needs MIN_WIDTH px across.
    """
    if stage is not None and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    rows = {row.key: row for row in flow_rows(trace, info)}
    fig = finish(go.Figure(), title, large)
    size = fig.layout.font.size  # the shared figure text size (larger for a projector)
    text = text_size(size)
    y = Rows(LINE_SPACING * text, 3 if rows["residual"].facts["norms"] == 4 else 2)
    parts = (
        input_band(trace, info, rows, words, y) + layer_band(rows, words, y) + output_band(trace, info, rows, words, y)
    )
    deck = STACK_SHADOWS if len(trace.input_ids) > 1 else 0
    drawing = Drawing([], [])
    for part in parts:
        draw(drawing, part, stage, text, size, deck)
    # Set at once: plotly re-checks the whole list on each add_shape/add_annotation (quadratic, ~0.4 s here).
    fig.update_layout(shapes=drawing.shapes, annotations=drawing.annotations)
    title_height = round(LINE_SPACING * (size + 3)) + 10 if title else 4  # finish() titles at size + 3
    fig.update_layout(
        height=round(y.height) + title_height + 4,
        margin=dict(l=6, r=6, t=title_height, b=4),
        title=dict(y=1, yref="container", yanchor="top", pad=dict(t=6)),
    )
    fig.update_xaxes(range=[0, 100], visible=False, fixedrange=True)
    fig.update_yaxes(range=[0, y.height], visible=False, fixedrange=True)
    fig.update_layout(showlegend=False, plot_bgcolor="white", hovermode=False)
    return fig


def text_size(size: int) -> int:
    """Px of the picture's words for the page's figure text size `size` (13 normal, 18 large): 13 and 16."""
    return max(MIN_TEXT, round(TEXT * size))


def shape_label(row: FlowRow, x: float, y: float, align: str = "center", prefix: str = "") -> Label:
    """A label showing `row`'s shape (its stage's colour when highlighted)."""
    return Label(row.stage, x, y, prefix + row.shape, key=row.key, align=align)


def input_band(trace: StepTrace, info: ModelInfo, rows: dict[str, FlowRow], words: Words, y: Rows) -> list:
    """Left of the layer: the id(s) above their embedding rows, which enter the layer."""
    t = len(trace.input_ids)
    shown = ", ".join(str(i) for i in trace.input_ids[:2]) + (", …" if t > 2 else "")
    positions = rows["ids"].facts["positions"]
    ids_text = (
        words["sp_token_ids" if t > 1 else "sp_token_id"].format(n=t, ids=shown)
        + "<br>"
        + words["sp_positions" if t > 1 else "sp_position"].format(positions=positions)
    )
    embed_text = (
        words["sp_embedding"]
        + "<br>"
        + words["sp_embedding_rows"].format(vocab=fmt_int(info.vocab), hidden=info.hidden)
    )
    learned = "positions" in rows  # GPT-2: a learned row per position is added (wpe), shown in the box
    token_bottom = y.layer_top - y.box(2)
    embed_bottom = y.layer_bottom + 4  # x0 leaves the box at y.mid, in its upper half
    embed_top = embed_bottom + (y.labelled_box(3) if learned else y.box(3))
    parts = [
        Box("token_id", 0.5, token_bottom, 26, y.layer_top, ids_text, per_token=True),
        Arrow("token_id", ((13, token_bottom), (13, embed_top))),
        shape_label(rows["ids"], 14, (token_bottom + embed_top + STACK_SHADOWS * SHADOW_Y) / 2, "left"),
        Box("embedding", 0.5, embed_bottom, 26, embed_top, embed_text, per_token=True, text_on_top=learned),
    ]
    if learned:  # the position table's name in GPT-2's weights, on the box's last line
        parts.append(
            shape_label(
                rows["positions"], 13.25, embed_bottom + PAD + y.line / 2, prefix=words["sp_position_rows"] + " "
            )
        )
    return parts


def layer_band(rows: dict[str, FlowRow], words: Words, y: Rows) -> list:
    """The layer, drawn once for all N: x0 → norm, q/k/v → attention (via the paged cache above) → ⊕ → norm, FFN
    → ⊕, with the residual (skip) lines under the row."""
    mid, low, high = y.mid, y.row_bottom, y.row_top
    plus = y.line * 0.6  # a ⊕ node's half height
    above = high + STACK_SHADOWS * SHADOW_Y + 2 + y.line / 2  # a one-line label just above the row (and its deck)
    layers = rows["residual"].facts
    post = "_post" if layers["norms"] == 4 else ""  # each branch's output normalised too, before its add
    return [
        Box(FRAME, 27.5, y.layer_bottom, 99.8, y.layer_top, ""),  # one layer drawn stands for all N
        Label(
            "residual",
            99.3,
            y.layer_top - 3 - y.line,
            words["sp_layers" + post].format(layers=layers["layers"], adds=layers["adds"], norms=layers["norms"]),
            align="right",
        ),
        Arrow("embedding", ((26, mid), (36, mid))),
        shape_label(rows["embed"], 31.75, mid + 2 + y.line, prefix="x0<br>"),
        Box("attention", 36, low, 47, high, words["sp_norm_qkv"], per_token=True),
        Arrow("attention", ((47, mid), (59, mid))),
        shape_label(rows["q"], 53.4, mid + 2 + y.line / 2),  # centred in what a prefill's deck leaves of the gap
        Box("attention", 59, low, 69, high, words["sp_attend" + post], per_token=True),
        # K and V go up into the cache; attention reads the whole cache back down.
        Arrow("kv_write", ((41.5, high), (41.5, y.cache_bottom))),
        Box("kv_write", 36, y.cache_bottom, 52, y.cache_top, words["sp_cache_write"], text_on_top=True),
        shape_label(rows["write_kv"], 44, y.cache_bottom + PAD + y.line / 2),
        Box(
            "kv_read",
            52,
            y.cache_bottom,
            68,
            y.cache_top,
            cache_read_text(rows["read_kv"].facts["n"], words, rows["read_kv"].facts["window"]),
            text_on_top=True,
        ),
        shape_label(rows["read_kv"], 60, y.cache_bottom + PAD + y.line / 2),
        Arrow("kv_read", ((63, y.cache_bottom), (63, high))),
        Arrow("attention", ((69, mid), (72, mid))),
        Box("residual", 72, mid - plus, 74.4, mid + plus, "+", round=True),
        Box("ffn", 77.5, low, 88, high, words["sp_ffn" + post], per_token=True),
        Arrow("residual", ((74.4, mid), (77.5, mid))),
        shape_label(rows["mlp"], 82.75, above),
        Arrow("ffn", ((88, mid), (91.6, mid))),
        Box("residual", 91.6, mid - plus, 94, mid + plus, "+", round=True),
        # The skip lines: x0 around attention onto x1, x1 around the FFN onto x2.
        Arrow("residual", ((30, mid), (30, y.skip), (73.2, y.skip), (73.2, mid - plus))),
        Label("residual", 51.6, y.skip - 3 - y.line / 2, words["sp_add_attention" + post]),
        Arrow("residual", ((75.8, mid), (75.8, y.skip), (92.8, y.skip), (92.8, mid - plus))),
        Label("residual", 84.3, y.skip - 3 - y.line / 2, words["sp_add_ffn" + post]),
    ]


def cache_read_text(length: int, words: Words, window: int | None = None) -> str:
    """The read box's words: "read K, V of all 44 positions" (of the one position, in a one-token prefill); where
    local layers read a sliding window shorter than that, "local: the last 512, global: all 600"."""
    if window is not None and window < length:
        return words["sp_cache_read_window"].format(window=window, length=length)
    return words["sp_cache_read_one"] if length == 1 else words["sp_cache_read"].format(length=length)


def output_band(trace: StepTrace, info: ModelInfo, rows: dict[str, FlowRow], words: Words, y: Rows) -> list:
    """Under the layer: the last position's x2 → final norm → lm_head → logits → softmax and filters → the new id,
    which takes two paths: its text to the user, its embedding row to the next step."""
    drawn = next((c for c in trace.candidates if c.token_id == trace.token_id), None)
    chance = "<br>" + words["sp_chance"].format(p=fmt_percent(drawn.p_top_p)) if drawn else ""
    piece = plotly_text(visible(trace.text))
    last = words["sp_last_position"].format(position=trace.positions[-1])
    mid, line = y.out_mid, y.line
    two, three, five = y.box(2) / 2, y.box(3) / 2, y.box(5) / 2  # half heights
    text_mid, next_mid = y.out_top - two, three  # the two paths' boxes, stacked
    return [
        Arrow("final_norm", ((94, y.mid), (97.5, y.mid), (97.5, y.link), (6, y.link), (6, mid + two))),
        Label("final_norm", 52, y.link, last + ": x2 " + rows["final_norm"].shape, key="final_norm"),
        Box("final_norm", 0.5, mid - two, 11.5, mid + two, words["sp_final_norm"]),
        Arrow("final_norm", ((11.5, mid), (18.5, mid))),
        shape_label(rows["final_norm"], 15, mid + 2 + line / 2),
        Box(
            "lm_head",
            18.5,
            mid - two,
            31,
            mid + two,
            words["sp_lm_head"].format(vocab=fmt_int(info.vocab), hidden=info.hidden),
        ),
        Arrow("lm_head", ((31, mid), (40, mid))),
        shape_label(rows["lm_head"], 35.5, mid + 2 + line, prefix=words["sp_logits"] + "<br>"),
        Box("sampling", 40, mid - five, 59.5, mid + five, words["sp_sampling"] + chance),
        Arrow("sampling", ((59.5, mid), (63, mid))),
        Box(
            "sampling",
            63,
            mid - three,
            72,
            mid + three,
            words["sp_new_id"].format(id=trace.token_id) + f"<br>“{piece}”",
        ),
        Arrow("detokenize", ((72, mid + line / 2), (74.5, mid + line / 2), (74.5, text_mid), (77, text_mid))),
        Box("detokenize", 77, y.out_top - 2 * two, 99.8, y.out_top, words["sp_detokenize"].format(piece=piece)),
        Arrow("next_input", ((72, mid - line / 2), (74.5, mid - line / 2), (74.5, next_mid), (77, next_mid))),
        Box(
            "next_input",
            77,
            0,
            99.8,
            2 * three,
            words["sp_next_input"].format(id=trace.token_id, position=trace.positions[-1] + 1),
        ),
        shape_label(rows["next_input"], 74, (mid - three) / 2, "right", prefix=words["sp_row"] + " "),
    ]
