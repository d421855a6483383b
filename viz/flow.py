"""One step, end to end: the id's embedding row, the residual stream through every layer, the logits,
the sampled id, and the id's two paths (text for the user, embedding row for the next step)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.model import ModelInfo
from engine.trace import StepTrace
from viz.style import OKABE_ITO, finish


def flow_frame(trace: StepTrace, info: ModelInfo) -> pd.DataFrame:
    """The chain of one forward pass with the real model's shapes."""
    t = len(trace.input_ids)
    concat = info.q_heads * info.head_dim
    kv = info.kv_heads * info.head_dim
    rows = [
        ("token ids", f"({t},)", f"ids {trace.input_ids[:6]}{' …' if t > 6 else ''}: only row numbers"),
        ("embed_tokens lookup", f"({t}, {info.hidden})", f"table {info.vocab} × {info.hidden}; position is not in it"),
    ]
    if info.positions == "learned":
        rows.append(("+ position embeddings", f"({t}, {info.hidden})", "GPT-2 adds a learned row per position"))
    rows += [
        (f"× {info.layers} layers: input_layernorm", f"({t}, {info.hidden})", info.norm),
        ("q_proj / k_proj / v_proj", f"Q ({t}, {info.q_heads}×{info.head_dim}), K/V ({t}, {info.kv_heads}×{info.head_dim})",
         f"GQA: {info.gqa_group} Q heads share one KV head"),
        ("write K, V to the paged cache", f"+{t} positions × {kv} per layer", "then attend over every cached position"),
        ("attention per head", f"{info.q_heads} × ({t}, {info.head_dim})", "s = q·k/√d, a = softmax(s), out = Σ a v"),
        ("concatenate heads → o_proj", f"({t}, {concat}) → ({t}, {info.hidden})", "x1 = x0 + o_proj(…): 1st residual add"),
        ("post_attention_layernorm → MLP", f"({t}, {info.intermediate}) → ({t}, {info.hidden})",
         "x2 = x1 + mlp(norm(x1)): 2nd add, onto x1"),
        ("final norm (last position only)", f"({info.hidden},)", "only the last position predicts the next token"),
        ("lm_head", f"({info.vocab},) logits", "hidden × vocab matrix" + (" (tied to embed_tokens)" if info.tied_embeddings else "")),
        ("softmax → filters → sample", f"({info.vocab},) → 1 id", f"new id {trace.token_id}"),
    ]
    return pd.DataFrame(rows, columns=["stage", "shape", "note"])


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
