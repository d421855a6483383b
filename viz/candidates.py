"""The top next-token candidates and their probability before and after each sampling filter."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.trace import StepTrace
from viz.style import OKABE_ITO, finish
from viz.tokens import visible

STAGES = (("p_raw", "softmax(logits)"), ("p_temperature", "÷ temperature"), ("p_top_k", "top-k"),
          ("p_top_p", "top-p → drawn from"))


def candidates_frame(trace: StepTrace) -> pd.DataFrame:
    rows = []
    for c in trace.candidates:
        rows.append({"token": visible(c.text), "id": c.token_id, "logit": c.logit, "p_raw": c.p_raw,
                     "p_temperature": c.p_temperature, "p_top_k": c.p_top_k, "p_top_p": c.p_top_p,
                     "drawn": c.token_id == trace.token_id})
    return pd.DataFrame(rows)


def candidates_figure(trace: StepTrace, title: str = "", large: bool = False) -> go.Figure:
    frame = candidates_frame(trace)
    labels = [f"{'▶ ' if d else ''}{t} ({i})" for t, i, d in zip(frame["token"], frame["id"], frame["drawn"])]
    colors = [OKABE_ITO["grey"], OKABE_ITO["sky"], OKABE_ITO["blue"], OKABE_ITO["vermillion"]]
    fig = go.Figure()
    for (column, name), color in zip(STAGES, colors):
        fig.add_bar(y=labels, x=frame[column], name=name, orientation="h", marker_color=color,
                    hovertemplate="%{y}: %{x:.4f}<extra>" + name + "</extra>")
    fig.update_layout(barmode="group", yaxis=dict(autorange="reversed"), xaxis=dict(range=[0, 1], title="p"),
                      legend=dict(orientation="h", y=-0.15))
    return finish(fig, title, large, height=120 + 34 * len(labels))
