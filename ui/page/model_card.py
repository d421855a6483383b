"""The model card: the loaded model's shapes beside the articles' toy model and Qwen3-0.6B.

Every number of the "this model" column comes from the engine's ModelInfo; the articles' two models are
written out as the articles give them (docs/teaching.md, T1–T3, T7). One function formats all three columns, so a
model of Qwen3-0.6B's shape shows exactly the articles' figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import streamlit as st

from engine.kv_cache import kv_bytes_per_token
from engine.model_info import ModelInfo

MISSING = "—"  # the articles do not give this number for their toy model


@dataclass(frozen=True)
class Shape:
    """The sizes a card row is made of; None where a source does not say."""

    hidden: int
    layers: int
    vocab: int
    q_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    element_bytes: int | None = None
    dtype: str | None = None

    @classmethod
    def of(cls, info: ModelInfo) -> Shape:
        return cls(
            hidden=info.hidden,
            layers=info.layers,
            vocab=info.vocab,
            q_heads=info.q_heads,
            kv_heads=info.kv_heads,
            head_dim=info.head_dim,
            element_bytes=info.element_bytes,
            dtype=info.dtype,
        )


ARTICLES_TOY = Shape(hidden=128, layers=4, vocab=50_000)  # the articles' simplified model
QWEN3_0_6B = Shape(
    hidden=1024, layers=28, vocab=151_936, q_heads=16, kv_heads=8, head_dim=128, element_bytes=2, dtype="bfloat16"
)

ROWS = (
    "card_hidden",
    "card_layers",
    "card_adds",
    "card_q_heads",
    "card_kv_heads",
    "card_group",
    "card_concat",
    "card_embedding",
    "card_kv_bytes",
    "card_kv_bytes_mha",
)


def card_values(shape: Shape) -> dict[str, str]:
    """Row key → the shown value, e.g. "card_concat": "16 × 128 = 2,048 → o_proj → 1,024"."""
    values = {
        "card_hidden": f"{shape.hidden:,}",
        "card_layers": f"{shape.layers:,}",
        "card_adds": f"2 × {shape.layers} = {2 * shape.layers:,}",
        "card_embedding": f"{shape.vocab:,} × {shape.hidden:,}",
    }
    if shape.q_heads is not None:
        q, kv, d = shape.q_heads, shape.kv_heads, shape.head_dim
        values.update(
            {
                "card_q_heads": f"{q} × {d}",
                "card_kv_heads": f"{kv} × {d}",
                "card_group": f"{q} / {kv} = {q // kv}",
                "card_concat": f"{q} × {d} = {q * d:,} → o_proj → {shape.hidden:,}",
                "card_kv_bytes": _kv_bytes(shape, kv),
                "card_kv_bytes_mha": _kv_bytes(shape, q),
            }
        )
    return {row: values.get(row, MISSING) for row in ROWS}


def _kv_bytes(shape: Shape, heads: int) -> str:
    """ "2 × 28 × 8 × 128 × 2 = 114,688 (bfloat16)": K and V × layers × heads × head_dim × bytes per element."""
    total = kv_bytes_per_token(shape.layers, heads, shape.head_dim, shape.element_bytes)
    return f"2 × {shape.layers} × {heads} × {shape.head_dim} × {shape.element_bytes} = {total:,} ({shape.dtype})"


def same_shape(info: ModelInfo, other: Shape) -> bool:
    """Whether the loaded model has `other`'s shapes, whatever dtype it was loaded in."""
    return replace(Shape.of(info), element_bytes=None, dtype=None) == replace(other, element_bytes=None, dtype=None)


def card_frame(info: ModelInfo, t) -> pd.DataFrame:
    """The card as a table: one row per ROWS key, columns this model / the articles' toy / Qwen3-0.6B."""
    columns = {
        t("card_this_model"): card_values(Shape.of(info)),
        t("card_toy"): card_values(ARTICLES_TOY),
        "Qwen3-0.6B": card_values(QWEN3_0_6B),
    }
    frame = pd.DataFrame(columns, index=list(ROWS))
    frame.index = [t(row) for row in ROWS]
    return frame


def render(info: ModelInfo, t) -> None:
    """A collapsed expander at the page's foot (the first screen is the step's): the card and what it says."""
    with st.expander(t("card_title"), expanded=False):
        st.caption(t("card_intro", name=info.name, dtype=info.dtype))
        st.table(card_frame(info, t))
        st.caption(t("card_same_shape" if same_shape(info, QWEN3_0_6B) else "card_note"))
        if info.family.startswith("gemma"):  # Gemma's terms ask that the notice goes with the model
            st.caption(t("card_gemma_licence"))
