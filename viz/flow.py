"""One step, end to end: the id's embedding row, the residual stream through every layer, the logits,
the sampled id, and the id's two paths (text for the user, embedding row for the next step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.model_info import ModelInfo
from engine.trace import StepTrace
from viz.style import DIVERGING, OKABE_ITO, TOP_LEGEND, finish
from viz.words import ENGLISH, Words


@dataclass(frozen=True)
class FlowRow:
    key: str  # names the row; the page words it (ui.text.strings: flow_stage_<key>, flow_note_<key>)
    stage: str  # the part of the step picture it belongs to (one of viz.step_picture.STAGES)
    shape: str  # the tensor shape(s) here, as the table's shape column and the picture's arrows show them
    facts: dict  # numbers the note quotes


def flow_rows(trace: StepTrace, info: ModelInfo) -> list[FlowRow]:
    """The chain of one forward pass with the real model's shapes: t rows go in (t = 1 in decode, the
    prompt's length in prefill), the cache holds `context_length` positions after the write, and only the
    last row goes on past the layers. The flow table and the step picture both read these rows."""
    t, length = len(trace.input_ids), trace.context_length
    concat = info.q_heads * info.head_dim
    per_token_kv = f"({info.kv_heads}, {info.head_dim})"
    rows = [
        FlowRow(
            "ids",
            "token_id",
            f"({t},)",
            {"ids": str(trace.input_ids[:6]) + (" …" if t > 6 else ""), "positions": position_span(trace)},
        ),
        FlowRow("embed", "embedding", f"({t}, {info.hidden})", {"vocab": info.vocab, "hidden": info.hidden}),
    ]
    if info.positions == "learned":
        rows.append(FlowRow("positions", "embedding", f"({t}, {info.hidden})", {}))
    rows += [
        FlowRow("norm", "attention", f"({t}, {info.hidden})", {"layers": info.layers, "norm": info.norm}),
        FlowRow(
            "q",
            "attention",
            f"Q ({t}, {info.q_heads}×{info.head_dim})",
            {"q_heads": info.q_heads, "head_dim": info.head_dim},
        ),
        FlowRow("kv", "attention", f"K, V ({t}, {info.kv_heads}×{info.head_dim})", {"group": info.gqa_group}),
        FlowRow("write_kv", "kv_write", f"+{t} × {per_token_kv}", {"n": t}),
        FlowRow("read_kv", "kv_read", f"{length} × {per_token_kv}", {"n": length, "window": info.sliding_window}),
        FlowRow("attend", "attention", f"{info.q_heads} × ({t}, {info.head_dim})", {}),
        FlowRow("o_proj", "attention", f"({t}, {concat}) → ({t}, {info.hidden})", {}),
        FlowRow("mlp", "ffn", f"({t}, {info.intermediate}) → ({t}, {info.hidden})", {}),
        FlowRow(
            "residual",
            "residual",
            f"({t}, {info.hidden})",
            {"layers": info.layers, "adds": 2 * info.layers, "norms": len(info.layer_norms)},
        ),
        FlowRow("final_norm", "final_norm", f"({info.hidden},)", {}),
        FlowRow("lm_head", "lm_head", f"({info.vocab},)", {"tied": info.tied_embeddings}),
        FlowRow("sample", "sampling", f"({info.vocab},) → 1", {"id": trace.token_id}),
        FlowRow("detokenize", "detokenize", "(1,)", {"id": trace.token_id}),
        FlowRow("next_input", "next_input", f"({info.hidden},)", {"id": trace.token_id}),
    ]
    return rows


def position_span(trace: StepTrace) -> str:
    """The positions a step fed: "40" in decode, "0–40" in prefill."""
    first, last = trace.positions[0], trace.positions[-1]
    return str(first) if first == last else f"{first}–{last}"


def layer_tick(layers: int) -> int | None:
    """Layers between labels on a layer axis: every one while they are few; every other one up to 32, so 30
    labels do not crowd a phone's width; Plotly's own spacing beyond that."""
    return 1 if layers <= 12 else 2 if layers <= 32 else None


def residual_figure(
    residual: np.ndarray, title: str = "", large: bool = False, words: Words = ENGLISH, post_norms: bool = False
) -> go.Figure:
    """|x0|, |x1|, |x2| (vector lengths) per layer at the predicting position: two adds per layer, the
    second onto x1. Labels use plain "|x|": "‖" is missing from many fonts and draws as a box. `post_norms`: each
    branch's output is normalised before its add (Gemma 3's four norms a layer), and the legend says so."""
    norms = np.linalg.norm(residual, axis=-1)  # (layers, 3)
    layers = list(range(norms.shape[0]))
    fig = go.Figure()
    colors = {"x0": OKABE_ITO["grey"], "x1": OKABE_ITO["sky"], "x2": OKABE_ITO["vermillion"]}
    for i, (key, color) in enumerate(colors.items()):
        fig.add_scatter(
            x=layers,
            y=norms[:, i],
            mode="lines+markers",
            name=words["residual_" + key + ("_post" if post_norms and key != "x0" else "")],
            line=dict(color=color),
            hovertemplate=words["layer"] + " %{x}: |" + key + "| = %{y:,.1f}",
        )
    fig.update_layout(
        xaxis=dict(title=words["layer"], dtick=layer_tick(len(layers))),
        yaxis=dict(title=words["norm_axis"]),
        legend=TOP_LEGEND,
    )
    return finish(fig, title, large, height=340)


def vector_figure(
    vectors: dict[str, np.ndarray], title: str = "", large: bool = False, words: Words = ENGLISH
) -> go.Figure:
    """Vectors as colour strips, one row each (e.g. the final hidden state and the next input's embedding row).

    Each row has its own symmetric colour scale (±its largest |value|): the vectors differ in size by an
    order of magnitude, and on a shared scale the smaller one would look blank. Hover shows true values.
    """
    names = list(vectors)
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.25 / max(1, len(names)),
        subplot_titles=[f"{n} (±{float(np.abs(vectors[n]).max()):,.2f})" for n in names],
    )
    for i, name in enumerate(names):
        v = np.asarray(vectors[name], dtype=float)
        top = float(np.abs(v).max()) or 1.0
        fig.add_trace(
            go.Heatmap(
                z=v[None, :],
                y=[""],
                colorscale=DIVERGING,
                zmin=-top,
                zmax=top,
                name=name,
                showscale=False,
                hovertemplate=name + "<br>" + words["dim"] + " %{x}: %{z:.3f}<extra></extra>",
            ),
            row=i + 1,
            col=1,
        )
    fig.update_xaxes(title=words["dimension"], row=len(names), col=1)
    return finish(fig, title, large, height=120 + 90 * len(names))
