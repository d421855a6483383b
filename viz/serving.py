"""Many requests served from one pool: the pool's blocks coloured by the request holding them (a shared block marked
by how many hold it), the steps each request took part in (prefill, decode, waiting, preempted), tokens per second
against the batch, and the requests' table. Plain data in (`engine.server.StepReport`), figures and tables out."""

from __future__ import annotations

import math
from statistics import median

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.server import StepReport
from viz.style import OKABE_ITO, TOP_LEGEND, finish, text_color_on, tick_step
from viz.words import ENGLISH, Words

# One colour per request, the most distinct first; a class of more requests reuses them (each block says its request)
REQUEST_COLORS = [OKABE_ITO[c] for c in ("blue", "orange", "green", "purple", "sky", "vermillion", "yellow")]
SHARED_COLOR = "#333333"
FREE_COLOR = "#eeeeee"
# What a request did in a step, as the timeline colours it
ACTIVITY_COLORS = {
    "waiting": "#d9d9d9",
    "prefill": OKABE_ITO["sky"],
    "decode": OKABE_ITO["orange"],
    "preempted": OKABE_ITO["vermillion"],
}
ACTIVITIES = tuple(ACTIVITY_COLORS)


def request_label(request: int) -> str:
    """R1, R2, …: requests as the page names them (ids count from 0)."""
    return f"R{request + 1}"


def request_names(requests) -> str:
    """ "R1, R3": requests by their labels."""
    return ", ".join(request_label(r) for r in requests)


def request_color(request: int) -> str:
    return REQUEST_COLORS[request % len(REQUEST_COLORS)]


def block_fill(report: StepReport, block_size: int) -> dict[int, tuple[int, int]]:
    """Each used block's (first owner's logical index, tokens it holds) after the step."""
    out = {}
    for state in report.requests:
        for logical, block in enumerate(state.blocks):
            if block not in out:
                out[block] = (logical, min(block_size, max(0, state.cached - logical * block_size)))
    return out


def pool_columns(num_blocks: int) -> int:
    """Blocks a row: few enough that a phone's width still reads each block's label."""
    return 5 if num_blocks <= 10 else 8 if num_blocks <= 40 else 16


def pool_figure(
    report: StepReport | None,
    num_blocks: int,
    block_size: int,
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """The pool's blocks in rows: a block one request holds in its colour, "R2" over the tokens it holds ("12/16"); a
    block several hold in dark grey, "×3" (its reference count); a free block empty, its number in grey. The hover
    names the block, its logical number in each owner's table and its owners."""
    columns = pool_columns(num_blocks)
    rows = math.ceil(num_blocks / columns)
    owners = report.owners if report is not None else {}
    fill = block_fill(report, block_size) if report is not None else {}
    fig = go.Figure()
    xs, ys, texts, colors, hovers = [], [], [], [], []
    size = 13 + (3 if large else 0)
    for block in range(num_blocks):
        x, y = block % columns, block // columns
        held = owners.get(block, ())
        logical, tokens = fill.get(block, (0, 0))
        if not held:
            color, text, hover = FREE_COLOR, str(block), words["serve_block_free"].format(block=block)
        elif len(held) == 1:
            color = request_color(held[0])
            text = f"<b>{request_label(held[0])}</b><br>{tokens}/{block_size}"
            hover = words["serve_block_one"].format(
                block=block, request=request_label(held[0]), logical=logical, tokens=tokens, size=block_size
            )
        else:
            color = SHARED_COLOR
            text = f"<b>×{len(held)}</b><br>{tokens}/{block_size}"
            hover = words["serve_block_shared"].format(
                block=block, count=len(held), logical=logical, requests=request_names(held)
            )
        fig.add_shape(
            type="rect",
            x0=x - 0.46,
            x1=x + 0.46,
            y0=y - 0.44,
            y1=y + 0.44,
            fillcolor=color,
            layer="below",
            line=dict(color="#bbbbbb" if not held else color, width=1),
        )
        xs.append(x), ys.append(y), texts.append(text), hovers.append(hover)
        colors.append("#999999" if not held else text_color_on(color))
    fig.add_scatter(
        x=xs,
        y=ys,
        mode="text",
        text=texts,
        textfont=dict(size=size, color=colors),
        hovertext=hovers,
        hoverinfo="text",
        showlegend=False,
    )
    fig.update_xaxes(visible=False, range=[-0.5, columns - 0.5])
    fig.update_yaxes(visible=False, range=[rows - 0.5, -0.5])
    height = 60 + (30 if title else 0) + rows * (64 if large else 54)
    return finish(fig, title, large, height=height)


def waited(report: StepReport) -> list[int]:
    """The requests that arrived, are not done, and had no part in the step: not admitted yet, preempted before, or
    running past the step's `max_num_seqs`."""
    ran = {rid for rid, _, _ in report.ran}
    return [
        s.id for s in report.requests if s.id not in ran and s.id not in report.preempted and s.status != "finished"
    ]


def activities(steps: list[StepReport], requests: int) -> np.ndarray:
    """(requests, steps) what each request did in each step: an index of ACTIVITIES, or -1 (not arrived, or
    finished before the step)."""
    grid = np.full((requests, len(steps)), -1, dtype=np.int8)
    for column, report in enumerate(steps):
        grid[[rid for rid, _, _ in report.ran], column] = ACTIVITIES.index("prefill" if report.prefill else "decode")
        grid[list(report.preempted), column] = ACTIVITIES.index("preempted")
        grid[waited(report), column] = ACTIVITIES.index("waiting")
    return grid


def timeline_figure(
    steps: list[StepReport], requests: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """A row per request, a column per step: prefilled (the tokens it computed written in), decoded, waited, or
    was preempted; blank before it arrived and after it finished."""
    grid = activities(steps, requests)
    count = len(steps)
    computed = {(rid, i): tokens for i, report in enumerate(steps) if report.prefill for rid, tokens, _ in report.ran}
    fig = go.Figure()
    for index, name in enumerate(ACTIVITIES):
        cells = np.argwhere(grid == index)
        label = words["serve_" + name]
        fig.add_scatter(
            x=[int(c) + 1 for _, c in cells],
            y=[request_label(int(r)) for r, _ in cells],
            mode="markers",
            marker=dict(symbol="square", size=22 if large else 17, color=ACTIVITY_COLORS[name]),
            name=label,
            hovertemplate=f"{label}: %{{y}}, {words['step']} %{{x}}<extra></extra>",
        )
    written = list(computed)
    if written:
        fig.add_scatter(
            x=[c + 1 for _, c in written],
            y=[request_label(r) for r, _ in written],
            mode="text",
            text=[str(computed[w]) for w in written],
            hoverinfo="skip",
            showlegend=False,
            textfont=dict(size=10 + (3 if large else 0)),
        )
    fig.update_xaxes(title=words["serve_step_axis"], range=[0.5, max(count, 1) + 0.5], dtick=tick_step(max(count, 1)))
    fig.update_yaxes(
        categoryorder="array",
        categoryarray=[request_label(r) for r in range(requests)],
        autorange="reversed",
        type="category",
    )
    fig.update_layout(legend=TOP_LEGEND, bargap=0)
    return finish(fig, title, large, height=110 + (30 if title else 0) + requests * (30 if large else 24))


def decode_rates(steps: list[StepReport], seconds: list[float]) -> dict[int, list[float]]:
    """Tokens per second of each decode step, by its batch B (B tokens in the step's time)."""
    out: dict[int, list[float]] = {}
    for report, took in zip(steps, seconds):
        if not report.prefill and took > 0:
            out.setdefault(len(report.ran), []).append(len(report.ran) / took)
    return out


def throughput_figure(
    rates: dict[int, list[float]], title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """Each decode step's tokens per second at its batch size, and the median at each B."""
    fig = go.Figure()
    batches = sorted(rates)
    fig.add_scatter(
        x=[b for b in batches for _ in rates[b]],
        y=[r for b in batches for r in rates[b]],
        mode="markers",
        name=words["serve_each_step"],
        marker=dict(color=OKABE_ITO["grey"], size=8),
        hovertemplate="B = %{x}: %{y:,.0f} " + words["serve_tok_s"] + "<extra></extra>",
    )
    fig.add_scatter(
        x=batches,
        y=[median(rates[b]) for b in batches],
        mode="lines+markers",
        name=words["serve_median"],
        line=dict(color=OKABE_ITO["orange"], width=3),
        hovertemplate="B = %{x}: %{y:,.0f} " + words["serve_tok_s"] + "<extra></extra>",
    )
    fig.update_xaxes(title=words["serve_batch_axis"], dtick=1, rangemode="tozero")
    fig.update_yaxes(title=words["serve_tok_s"], rangemode="tozero")
    fig.update_layout(legend=TOP_LEGEND)
    return finish(fig, title, large, height=320)


def requests_table(
    report: StepReport | None, questions: list[str], texts: list[str], arrived: int, words: Words = ENGLISH
) -> pd.DataFrame:
    """One row per request that has arrived: what it asked, what it is doing, its tokens, its blocks and its answer
    so far. Text cells are the user's and the model's text, shown as text by the table."""
    doing = {}
    if report is not None:
        for rid, tokens, cached in report.ran:
            doing[rid] = (
                words["serve_doing_prefill"].format(tokens=tokens, cached=cached)
                if report.prefill
                else words["serve_doing_decode"]
            )
        for rid in report.preempted:
            doing[rid] = words["serve_preempted"]
    rows = []
    states = {s.id: s for s in report.requests} if report is not None else {}
    for rid in range(arrived):
        state = states.get(rid)
        status = words["serve_status_" + state.status] if state is not None else words["serve_status_waiting"]
        rows.append(
            {
                "request": request_label(rid),
                "question": questions[rid],
                "status": status,
                "step": doing.get(rid, ""),
                "tokens": f"{state.prompt_length} + {len(state.generated)}" if state else "",
                "blocks": " ".join(map(str, state.blocks)) if state else "",
                "answer": texts[rid],
            }
        )
    frame = pd.DataFrame(rows, columns=["request", "question", "status", "step", "tokens", "blocks", "answer"])
    return frame.rename(columns={c: words["serve_col_" + c] for c in frame.columns})
