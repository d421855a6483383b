"""One step, end to end: the id's embedding row, the residual stream through every layer, the logits,
the sampled id, and the id's two paths (text for the user, embedding row for the next step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from engine.model import ModelInfo
from engine.trace import StepTrace
from viz.style import OKABE_ITO, finish


@dataclass(frozen=True)
class FlowRow:
    key: str  # names the stage; the page words it (ui.strings: flow_stage_<key>, flow_note_<key>)
    shape: str
    facts: dict  # numbers the note quotes


def flow_rows(trace: StepTrace, info: ModelInfo) -> list[FlowRow]:
    """The chain of one forward pass with the real model's shapes."""
    t = len(trace.input_ids)
    concat = info.q_heads * info.head_dim
    rows = [
        FlowRow("ids", f"({t},)", {"ids": str(trace.input_ids[:6]) + (" …" if t > 6 else "")}),
        FlowRow("embed", f"({t}, {info.hidden})", {"vocab": info.vocab, "hidden": info.hidden}),
    ]
    if info.positions == "learned":
        rows.append(FlowRow("positions", f"({t}, {info.hidden})", {}))
    rows += [
        FlowRow("norm", f"({t}, {info.hidden})", {"layers": info.layers, "norm": info.norm}),
        FlowRow("qkv", f"Q ({t}, {info.q_heads}×{info.head_dim}), K/V ({t}, {info.kv_heads}×{info.head_dim})",
                {"group": info.gqa_group}),
        FlowRow("write_kv", f"+{t} × {info.kv_heads * info.head_dim} (K) + {t} × {info.kv_heads * info.head_dim} (V)", {}),
        FlowRow("attend", f"{info.q_heads} × ({t}, {info.head_dim})", {}),
        FlowRow("o_proj", f"({t}, {concat}) → ({t}, {info.hidden})", {}),
        FlowRow("mlp", f"({t}, {info.intermediate}) → ({t}, {info.hidden})", {}),
        FlowRow("final_norm", f"({info.hidden},)", {}),
        FlowRow("lm_head", f"({info.vocab},)", {"tied": info.tied_embeddings}),
        FlowRow("sample", f"({info.vocab},) → 1", {"id": trace.token_id}),
    ]
    return rows


def residual_figure(residual: np.ndarray, title: str = "", large: bool = False) -> go.Figure:
    """‖x0‖, ‖x1‖, ‖x2‖ per layer at the predicting position: two adds per layer, the second onto x1."""
    norms = np.linalg.norm(residual, axis=-1)  # (layers, 3)
    layers = list(range(norms.shape[0]))
    fig = go.Figure()
    for i, (name, color) in enumerate((("x0 (layer input)", OKABE_ITO["grey"]), ("x1 = x0 + attention", OKABE_ITO["sky"]),
                                       ("x2 = x1 + FFN", OKABE_ITO["vermillion"]))):
        fig.add_scatter(x=layers, y=norms[:, i], mode="lines+markers", name=name, line=dict(color=color))
    fig.update_layout(xaxis=dict(title="layer", dtick=1 if len(layers) <= 32 else None), yaxis=dict(title="‖x‖"),
                      legend=dict(orientation="h", y=-0.2))
    return finish(fig, title, large, height=340)


def vector_figure(vectors: dict[str, np.ndarray], title: str = "", large: bool = False) -> go.Figure:
    """Vectors as colour strips (one row each): e.g. the final hidden state and the next input's embedding row."""
    names = list(vectors)
    z = np.stack([vectors[n] for n in names])
    fig = go.Figure(go.Heatmap(z=z, y=names, colorscale="RdBu", zmid=0,
                               hovertemplate="%{y}<br>dim %{x}: %{z:.4f}<extra></extra>"))
    fig.update_layout(xaxis=dict(title="dimension"))
    return finish(fig, title, large, height=120 + 40 * len(names))
