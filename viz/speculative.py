"""Speculative decoding, one verify pass at a time: the draft's guesses against the model's tokens (kept, the first
miss, and the model's own token that replaced it), and the paged cache's rows that pass wrote, kept and discarded;
the run's totals (tokens per pass, bytes read per token against plain decoding) and the drafts timed. Plain data in
(`engine.speculative.VerifyPass`), figures and tables out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pandas as pd
import plotly.graph_objects as go

from engine.model_info import ModelInfo
from engine.speculative import VerifyPass
from engine.timing import decode_step_bytes
from viz.style import HIT_COLOR, NEWEST_COLOR, OKABE_ITO, PROMPT_COLOR, finish, readable, text_color_on
from viz.words import ENGLISH, Words

# A guess and a cache row, as the pass left them
STATUS_COLORS = {
    "kept": HIT_COLOR,
    "miss": NEWEST_COLOR,
    "unread": "#d9d9d9",
    "model": OKABE_ITO["orange"],
    "cached": PROMPT_COLOR,
    "discarded": "#f4c4b0",
    "empty": "#ffffff",
}
MOST_BLOCKS = 4  # blocks the cache's part shows: the last ones the pass wrote


@dataclass(frozen=True)
class Cell:
    x: float  # its middle, in the cache's slots
    y: float
    text: str
    color: str
    hover: str
    width: float = 1


def guess_cells(done: VerifyPass, token_text: Callable[[int], str], words: Words, width: float = 1) -> list[Cell]:
    """Two rows, a column per decided token (`width` cells wide): the draft's guess (kept, the first miss, or never
    read after it) over the model's token at that row (its own, orange, where the pass took it)."""
    cells = []
    taken = len(done.added) - 1  # the column whose token is the model's own (or the last kept guess, at a stop)
    for i in range(len(done.guesses) + 1):
        x = (i + 0.5) * width - 0.5  # the column's middle, in the cache's slots
        if i < len(done.guesses):
            status = "kept" if i < done.accepted else "miss" if i == done.accepted else "unread"
            text = token_text(done.guesses[i])
            cells.append(
                Cell(x, 0, text, STATUS_COLORS[status], words[f"spec_guess_{status}"].format(n=i + 1, token=text))
            )
        else:
            cells.append(Cell(x, 0, "—", STATUS_COLORS["empty"], words["spec_no_guess"]))
        if i == done.accepted and i <= taken:
            text = token_text(done.token_id)
            cells.append(Cell(x, 1, text, STATUS_COLORS["model"], words["spec_model_takes"].format(token=text)))
        elif i < min(done.accepted, taken + 1):
            text = token_text(done.top[i])
            cells.append(Cell(x, 1, text, STATUS_COLORS["kept"], words["spec_model_agrees"].format(token=text)))
        else:
            cells.append(Cell(x, 1, "", STATUS_COLORS["unread"], words["spec_model_unread"]))
    return cells


def cache_cells(done: VerifyPass, block_size: int, words: Words, top: float) -> list[Cell]:
    """The last blocks the pass wrote, a row each from `top` down: positions cached before it, rows it wrote and
    kept, rows it wrote and discarded (a block only they used went back to the pool), empty slots."""
    written = {slot: i for i, slot in enumerate(done.slots)}
    blocks = list(dict.fromkeys(b for b, _ in done.slots))[-MOST_BLOCKS:]
    first_kept, end = done.first_position, done.context_length
    cells = []
    for row, block in enumerate(blocks):
        returned = block in done.blocks_returned
        logical = None if returned else done.block_table.index(block)
        label = words["spec_block_returned" if returned else "spec_block"].format(block=block)
        cells.append(Cell(-1, top + row, label, "#ffffff", label))  # a row label, written right-aligned
        for offset in range(block_size):
            position = None if logical is None else logical * block_size + offset
            if (block, offset) in written:
                position = first_kept + written[(block, offset)]
            if (block, offset) in written and position < end:
                status = "kept"
            elif (block, offset) in written:
                status = "discarded"
            elif position is not None and position < end:
                status = "cached"
            else:
                status = "empty"
            text = "" if position is None or status == "empty" else str(position)
            cells.append(
                Cell(
                    offset,
                    top + row,
                    text,
                    STATUS_COLORS[status],
                    words[f"spec_row_{status}"].format(block=block, offset=offset, position=position),
                )
            )
    return cells


def pass_figure(
    done: VerifyPass,
    token_text: Callable[[int], str],
    block_size: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """The pass in one picture: its guesses and the model's tokens, then the cache's blocks it wrote."""
    columns = len(done.guesses) + 1
    wide = max(1.0, min(3.0, block_size / columns))  # a guess's column: up to three slots, for a word to fit
    guesses = [replace(c, width=wide) for c in guess_cells(done, token_text, words, wide)]
    rows = min(MOST_BLOCKS, len(dict.fromkeys(b for b, _ in done.slots)))
    cache = cache_cells(done, block_size, words, top=3)
    width = max(columns * wide, block_size)
    fig = go.Figure()
    size = 13 + (3 if large else 0)
    labels = [
        (0, f"<b>{words['spec_row_draft']}</b>"),
        (1, f"<b>{words['spec_row_model']}</b>"),
        (2.3, f"<b>{words['spec_row_cache']}</b>"),
    ] + [(c.y, c.text) for c in cache if c.x < 0]
    for y, text in labels:
        fig.add_annotation(x=-0.6, y=y, text=text, showarrow=False, xanchor="right", font=dict(size=size))
    shown = guesses + [c for c in cache if c.x >= 0]
    for cell in shown:
        half = cell.width / 2 - 0.04
        fig.add_shape(
            type="rect",
            x0=cell.x - half,
            x1=cell.x + half,
            y0=cell.y - 0.42,
            y1=cell.y + 0.42,
            fillcolor=cell.color,
            line=dict(color="#bbbbbb", width=1),
            layer="below",
        )
    fig.add_scatter(
        x=[c.x for c in shown],
        y=[c.y for c in shown],
        mode="text",
        text=[c.text for c in shown],
        textfont=dict(size=size, color=[text_color_on(c.color) for c in shown]),
        hovertext=[c.hover for c in shown],
        hoverinfo="text",
        showlegend=False,
    )
    fig.update_xaxes(visible=False, range=[-5, width - 0.5])
    fig.update_yaxes(visible=False, range=[3 + rows - 0.5, -0.6])
    height = 40 + (30 if title else 0) + (3 + rows) * (50 if large else 40)
    return finish(fig, title, large, height=height)


@dataclass(frozen=True)
class Totals:
    """The run after its first passes: tokens, passes of the full model, and bytes read per token (the costs view's
    formula, `engine.timing.decode_step_bytes`), speculative against plain decoding, over the passes after the
    prefill's."""

    passes: int
    tokens: int
    decode_passes: int
    decode_tokens: int
    bytes_per_token: float  # a verify pass reads the weights and the cache once for all the tokens it adds
    plain_bytes_per_token: float  # plain decoding reads them once a token

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0


def totals(passes: Sequence[VerifyPass], info: ModelInfo) -> Totals:
    decode = passes[1:]
    spec = sum(decode_step_bytes(info, p.first_position + len(p.fed)) for p in decode)
    plain = sum(decode_step_bytes(info, p.first_position + 1 + i) for p in decode for i in range(len(p.added)))
    tokens = sum(len(p.added) for p in decode)
    return Totals(
        len(passes),
        sum(len(p.added) for p in passes),
        len(decode),
        tokens,
        spec / tokens if tokens else 0.0,
        plain / tokens if tokens else 0.0,
    )


def totals_table(done: Totals, words: Words = ENGLISH) -> pd.DataFrame:
    """Tokens per pass and MiB read per token after the prefill: this draft's against plain decoding's."""
    frame = pd.DataFrame(
        {
            "spec_measure": [words["spec_tokens_per_pass"], words["spec_mib_per_token"]],
            "spec_this_draft": [
                f"{done.tokens_per_pass:.2f}",
                f"{done.bytes_per_token / 2**20:,.1f}" if done.decode_tokens else "–",
            ],
            "spec_draft_none": ["1.00", f"{done.plain_bytes_per_token / 2**20:,.1f}" if done.decode_tokens else "–"],
        }
    )
    return readable(frame, words)


def passes_table(
    passes: Sequence[VerifyPass], token_text: Callable[[int], str], words: Words = ENGLISH
) -> pd.DataFrame:
    """One row a pass: rows it fed, its guesses, how many the model kept, the tokens it added and the rows it
    discarded."""
    frame = pd.DataFrame(
        {
            "spec_pass": [p.index + 1 for p in passes],
            "spec_rows": [p.rows_written for p in passes],
            "spec_guesses": [" ".join(token_text(t) for t in p.guesses) for p in passes],
            "spec_kept": [p.accepted for p in passes],
            "spec_added": [" ".join(token_text(t) for t in p.added) for p in passes],
            "spec_discarded": [p.rows_discarded for p in passes],
        }
    )
    return readable(frame, words)


def measured_table(rows, words: Words = ENGLISH) -> pd.DataFrame:
    """Plain decoding and each draft timed on this machine: passes, tokens, tokens a pass, ms a token, and whether
    its tokens are plain decoding's (`ui.runs.speculative.Measured.rows`)."""
    frame = pd.DataFrame(
        {
            "spec_draft": [words[f"spec_draft_{r.draft}"] for r in rows],
            "spec_passes": [r.passes for r in rows],
            "spec_tokens": [r.tokens for r in rows],
            "spec_tokens_per_pass": [r.tokens / r.passes for r in rows],
            "spec_ms_per_token": [r.ms_per_token for r in rows],
            "spec_same_tokens": [r.same_tokens for r in rows],
        }
    )
    return readable(
        frame,
        words,
        {
            "spec_tokens_per_pass": lambda x: f"{x:.2f}",
            "spec_ms_per_token": lambda x: f"{x:.1f}",
            "spec_same_tokens": lambda x: "✓" if x else "✗",
        },
    )
