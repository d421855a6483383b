"""The reveal of a class's prediction round: for each token drawn, the share of the class that guessed it beside the
probability the model's sampler gave it; the token the model picked marked."""

from __future__ import annotations

import plotly.graph_objects as go

from viz.style import OKABE_ITO, TOP_LEGEND, finish, plotly_text
from viz.words import ENGLISH, Words


def reveal_figure(
    bars, labels: list[str], answered: int, title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """`bars`: `ui.follow.class_answers.Bar`s, most probable first; `labels`: what each token reads as ("" for one the
    teacher hid, drawn as "hidden")."""
    names = [
        f"{'✓ ' if bar.picked else ''}{plotly_text(label) if not bar.hidden else words['reveal_hidden']}"
        f" ({bar.token_id})"
        for bar, label in zip(bars, labels, strict=True)
    ]
    share = [bar.count / answered if answered else 0.0 for bar in bars]
    fig = go.Figure()
    fig.add_bar(
        y=names,
        x=share,
        name=words["reveal_class"],
        orientation="h",
        marker_color=OKABE_ITO["orange"],
        text=[str(bar.count) if bar.count else "" for bar in bars],
        textposition="outside",
        hovertemplate="%{y}: %{x:.0%}<extra>" + words["reveal_class"] + "</extra>",
    )
    fig.add_bar(
        y=names,
        x=[bar.probability for bar in bars],
        name=words["reveal_model"],
        orientation="h",
        marker_color=OKABE_ITO["blue"],
        hovertemplate="%{y}: %{x:.2%}<extra>" + words["reveal_model"] + "</extra>",
    )
    fig.update_layout(
        barmode="group",
        yaxis=dict(autorange="reversed"),
        xaxis=dict(range=[0, 1.08], title=words["reveal_axis"], tickformat=".0%"),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=110 + 40 * len(bars))


def vote_figure(
    counts: tuple[int, ...],
    before: tuple[int, ...] | None,
    right: int,
    labels: list[str],
    title: str = "",
    large: bool = False,
    words: Words = ENGLISH,
) -> go.Figure:
    """A vote's counts per choice (`labels`: each choice's letter, A first), the right one marked ✓ and green; a vote
    again beside the round before (grey)."""
    names = [f"{'✓ ' if i == right else ''}{plotly_text(label)}" for i, label in enumerate(labels)]
    colors = [OKABE_ITO["green"] if i == right else OKABE_ITO["orange"] for i in range(len(labels))]
    fig = go.Figure()
    if before is not None:
        fig.add_bar(
            y=names,
            x=list(before),
            name=words["vote_first"],
            orientation="h",
            marker_color=OKABE_ITO["grey"],
            text=[str(n) for n in before],
            textposition="outside",
            hovertemplate="%{y}: %{x}<extra>" + words["vote_first"] + "</extra>",
        )
    name = words["vote_again"] if before is not None else words["vote_axis"]
    fig.add_bar(
        y=names,
        x=list(counts),
        name=name,
        orientation="h",
        marker_color=colors,
        text=[str(n) for n in counts],
        textposition="outside",
        hovertemplate="%{y}: %{x}<extra>" + name + "</extra>",
    )
    most = max([*counts, *(before or ()), 1])
    fig.update_layout(
        barmode="group",
        yaxis=dict(autorange="reversed"),
        showlegend=before is not None,
        xaxis=dict(range=[0, most * 1.15], title=words["vote_axis"], dtick=max(1, most // 5)),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=110 + (60 if before is not None else 40) * len(labels))
