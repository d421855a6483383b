"""The paged KV cache: blocks, the block table, what is stored and what is not, and the bytes."""

from __future__ import annotations

import streamlit as st

from ui.context import ViewContext
from ui.views.common import figure, layer_head_pickers, table, titled, words
from viz.kv_cache import block_table_frame, kv_bytes_table, kv_values_figure, occupancy_bar, pool_figure
from viz.style import fmt_int, fmt_size


def render(ctx: ViewContext) -> None:
    info = ctx.info
    if not titled(ctx, "kv_title"):
        return
    trace = ctx.trace
    pool = ctx.runner.pool_state()
    length = trace.context_length
    size = pool.block_size
    with st.container(key="main-figure"):  # blocks and slots first, then the numbers about them
        figure(pool_figure(trace.block_table, length, size, pool.blocks, ctx.labels, ctx.t("blocks_title"),
                           ctx.large, words=words(ctx)), "kv-blocks")
    c1, c2, c3 = st.columns(3)
    c1.metric(ctx.t("cached_positions"), length)
    c2.metric(ctx.t("blocks_used"), f"{len(trace.block_table)} × {size}")
    c3.metric(ctx.t("bytes_total", dtype=info.dtype), fmt_size(length * info.kv_bytes_per_token),
              help=ctx.t("bytes_help", per=fmt_int(info.kv_bytes_per_token), element=info.element_bytes))
    in_use = len(trace.block_table)
    figure(occupancy_bar(in_use, pool.cached_free, pool.blocks, ctx.t("pool_title", total=pool.blocks), ctx.large,
                         words=words(ctx)), "pool-occupancy")
    table(block_table_frame(trace.block_table, length, size, ctx.labels, words(ctx)))
    st.markdown(ctx.t("stored", layers=info.layers, kv=info.kv_heads, d=info.head_dim))
    st.markdown(ctx.t("not_stored"))
    layer, head = layer_head_pickers(ctx)
    kv_head = head // info.gqa_group
    k, v = ctx.runner.cached_kv(layer, length)
    which = st.radio(ctx.t("k_or_v"), ["K", "V"], horizontal=True, key="w_kv")
    values = (k if which == "K" else v)[:, kv_head].float().cpu().numpy()
    figure(kv_values_figure(values, ctx.labels, ctx.t("values_title", which=which, layer=layer, kv=kv_head,
                                                      head=head), ctx.large, words(ctx)),
           f"{which}-L{layer}-KV{kv_head}")
    st.markdown(ctx.t("bytes_title"))
    table(kv_bytes_table(info, length, words(ctx)))
    st.caption(ctx.t("private_cache"))
