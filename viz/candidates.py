"""The top next-token candidates and their probability before and after each sampling filter."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.trace import StepTrace
from viz.style import OKABE_ITO, check_mark, finish, fmt_percent, plotly_text, readable
from viz.tokens import visible
from viz.words import ENGLISH, Words

STAGES = ("p_raw", "p_temperature", "p_top_k", "p_top_p")  # each one's label: words["stage_" + stage]


def candidates_frame(trace: StepTrace) -> pd.DataFrame:
    rows = []
    for c in trace.candidates:
        rows.append({"token": visible(c.text), "id": c.token_id, "logit": c.logit, "p_raw": c.p_raw,
                     "p_temperature": c.p_temperature, "p_top_k": c.p_top_k, "p_top_p": c.p_top_p,
                     "drawn": c.token_id == trace.token_id})
    return pd.DataFrame(rows)


def candidates_table(trace: StepTrace, words: Words = ENGLISH) -> pd.DataFrame:
    """The candidates for people: the drawn mark first (so a narrow column never hides it), the token,
    its id and its probability at each stage as a percentage."""
    frame = candidates_frame(trace)[["drawn", "token", "id", *STAGES]]
    formats = {"drawn": check_mark, **{stage: fmt_percent for stage in STAGES}}  # ids are names: no separators
    return readable(frame, {c: words["cand_" + c] for c in frame.columns}, formats)


def candidates_figure(trace: StepTrace, title: str = "", large: bool = False, words: Words = ENGLISH) -> go.Figure:
    frame = candidates_frame(trace)
    labels = [f"{'▶ ' if d else ''}{plotly_text(t)} ({i})" for t, i, d in zip(frame["token"], frame["id"], frame["drawn"])]
    colors = [OKABE_ITO["grey"], OKABE_ITO["sky"], OKABE_ITO["blue"], OKABE_ITO["vermillion"]]
    fig = go.Figure()
    for column, color in zip(STAGES, colors):
        name = words["stage_" + column]
        fig.add_bar(y=labels, x=frame[column], name=name, orientation="h", marker_color=color,
                    hovertemplate="%{y}: %{x:.2%}<extra>" + name + "</extra>")
    fig.update_layout(barmode="group", yaxis=dict(autorange="reversed"),
                      xaxis=dict(range=[0, 1], title=words["probability"], tickformat=".0%"),
                      legend=dict(orientation="h", y=-0.15))
    return finish(fig, title, large, height=120 + 34 * len(labels))
