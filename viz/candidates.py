"""The top next-token candidates and their probability before and after each sampling filter."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.trace import StepTrace
from viz.style import OKABE_ITO, TOP_LEGEND, check_mark, finish, fmt_percent, plotly_text, readable
from viz.tokens import visible
from viz.words import ENGLISH, Words

STAGES = ("p_raw", "p_temperature", "p_top_k", "p_top_p")  # each one's label: words["stage_" + stage]


def candidates_frame(trace: StepTrace, labels: list[str] | None = None) -> pd.DataFrame:
    """One row per candidate. `labels`: what each candidate reads as (`viz.tokens.position_label` of its cell:
    "解²⁄₂" for the token that would finish 解, "⟨e8 a7⟩" for a piece of a character); by default its own text."""
    rows = []
    labels = labels or [visible(c.text) for c in trace.candidates]
    for c, label in zip(trace.candidates, labels, strict=True):
        rows.append(
            {
                "token": label,
                "id": c.token_id,
                "logit": c.logit,
                "p_raw": c.p_raw,
                "p_temperature": c.p_temperature,
                "p_top_k": c.p_top_k,
                "p_top_p": c.p_top_p,
                "drawn": c.token_id == trace.token_id,
            }
        )
    return pd.DataFrame(rows)


def candidates_table(trace: StepTrace, words: Words = ENGLISH, labels: list[str] | None = None) -> pd.DataFrame:
    """The candidates for people: the drawn mark first (so a narrow column never hides it), the token,
    its id and its probability as a percentage after each stage that changed it. A filter that is off (or
    changed none of these numbers) would repeat the column before it; its column is left out, so the table
    fits the page's side column at large text (the candidates chart shows every stage)."""
    frame = candidates_frame(trace, labels)
    stages = [STAGES[0]] + [
        stage for before, stage in zip(STAGES, STAGES[1:]) if not frame[stage].equals(frame[before])
    ]
    frame = frame[["drawn", "token", "id", *stages]]
    formats = {"drawn": check_mark, **{stage: fmt_percent for stage in stages}}  # ids are names: no separators
    return readable(frame, {c: words["cand_" + c] for c in frame.columns}, formats)


def candidates_figure(
    trace: StepTrace, title: str = "", large: bool = False, words: Words = ENGLISH, labels: list[str] | None = None
) -> go.Figure:
    frame = candidates_frame(trace, labels)
    bars = [
        f"{'▶ ' if drawn else ''}{plotly_text(token)} ({token_id})"
        for token, token_id, drawn in zip(frame["token"], frame["id"], frame["drawn"])
    ]
    colors = [OKABE_ITO["grey"], OKABE_ITO["sky"], OKABE_ITO["blue"], OKABE_ITO["vermillion"]]
    fig = go.Figure()
    for column, color in zip(STAGES, colors):
        name = words["stage_" + column]
        fig.add_bar(
            y=bars,
            x=frame[column],
            name=name,
            orientation="h",
            marker_color=color,
            hovertemplate="%{y}: %{x:.2%}<extra>" + name + "</extra>",
        )
    fig.update_layout(
        barmode="group",
        yaxis=dict(autorange="reversed"),
        xaxis=dict(range=[0, 1], title=words["probability"], tickformat=".0%"),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=120 + 34 * len(bars))
