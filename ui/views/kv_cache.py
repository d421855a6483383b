"""The paged KV cache: blocks, the block table, what is stored and what is not, and the bytes."""

from __future__ import annotations

import streamlit as st

from engine.errors import InvalidSettingError
from ui.state.link import POOLS
from ui.text.strings import Shown
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.contexts_shown import shown_contexts
from ui.views.figures import figure, memo_key, shared_table, table
from ui.views.widgets import layer_head_pickers, opened, titled, words
from viz.context_kv import contexts_figure
from viz.kv_bytes import (
    kv_bytes_table,
    layer_lengths_figure,
    layer_lengths_frame,
    layer_lengths_table,
    lengths_default,
    window_saving,
)
from viz.kv_cache import (
    block_table_frame,
    busy_pool_figure,
    difference_text,
    kv_values_figure,
    occupancy_bar,
    pool_figure,
)
from viz.style import fmt_int, fmt_size
from viz.window import layer_reach_figure, layer_reach_frame


def render(ctx: ViewContext) -> None:
    info = ctx.info
    if not titled(ctx, "kv_title"):
        return
    pool = ctx.runner.pool_state()
    length = ctx.trace.context_length
    picture = Part("pool")  # the figure first; the choice of pool under it (the first screen is the figure's)
    with picture.under:
        busy = (
            st.radio(
                ctx.t("pool_choice"),
                POOLS,
                key=ctx.setting_key("pool"),
                horizontal=True,
                help=ctx.t("pool_choice_help"),
                format_func=lambda p: ctx.t("pool_" + p),
            )
            == "busy"
        )
    if busy and ctx.runner.short_of_memory():  # the replay's pool is a second run's worth: the own pool instead
        st.info(ctx.t("short_of_memory", left_out=ctx.t("left_out_busy_pool")))
        busy = False
    if picture.shown:
        with picture:
            block_table = busy_pool(ctx) if busy else own_pool(ctx, pool)
    if shown():
        blocks(ctx, block_table, pool, busy)
    layer, head = layer_head_pickers(ctx)
    layer_reach(ctx, head)
    kv_values(ctx, layer, head, length)
    contexts(ctx)
    layer_lengths(ctx, length)
    if shown():
        st.markdown(ctx.t("bytes_title"))
        table(shared_table(lambda: kv_bytes_table(info, length, words(ctx)), memo_key(ctx, "bytes")))
        st.caption(ctx.t("private_cache"))


def blocks(ctx: ViewContext, block_table: list[int], pool, busy: bool) -> None:
    """The cache's numbers, the pool's occupancy (the run's own pool), the block table, what is stored."""
    info, length, size = ctx.info, ctx.trace.context_length, pool.block_size
    c1, c2, c3 = st.columns(3)
    c1.metric(ctx.t("cached_positions"), length)
    c2.metric(ctx.t("blocks_used"), f"{len(block_table)} × {size}")
    c3.metric(
        ctx.t("bytes_total", dtype=info.dtype),
        fmt_size(info.kv_bytes(length)),
        help=ctx.t("bytes_help", per=Shown(fmt_int(info.kv_bytes_per_token)), element=info.element_bytes),
    )
    if not busy:
        figure(
            lambda: occupancy_bar(
                len(block_table),
                pool.cached_free,
                pool.blocks,
                ctx.t("pool_title", total=pool.blocks),
                ctx.large,
                words=words(ctx),
            ),
            "pool-occupancy",
            memo_key(ctx, "occupancy", len(block_table), pool.cached_free, pool.blocks),
        )
    table(
        shared_table(
            lambda: block_table_frame(block_table, length, size, ctx.labels, words(ctx)),
            memo_key(ctx, "block-table", busy),
        )
    )
    st.markdown(ctx.t("stored", layers=info.layers, kv=info.kv_heads, d=info.head_dim))
    st.markdown(ctx.t("not_stored"))


def own_pool(ctx: ViewContext, pool) -> list[int]:
    """The run's own pool: its blocks and slots. Returns the run's block table."""
    trace = ctx.trace
    with st.container(key="main-figure"):  # blocks and slots first, then the numbers about them
        figure(
            lambda: pool_figure(
                trace.block_table,
                trace.context_length,
                pool.block_size,
                pool.blocks,
                ctx.labels,
                ctx.t("blocks_title"),
                ctx.large,
                words=words(ctx),
            ),
            "kv-blocks",
            memo_key(ctx, "pool", pool.block_size, pool.blocks),
        )
    return trace.block_table


def busy_pool(ctx: ViewContext) -> list[int]:
    """The run replayed by the engine in a pool other requests used first, and how exactly its K/V read through the
    scattered table match the run's own. Returns the replay's block table."""
    with st.spinner(ctx.t("busy_computing")):
        picture = ctx.runner.busy_pool(ctx.step)
    with st.container(key="main-figure"):
        figure(
            lambda: busy_pool_figure(
                picture.block_table,
                picture.length,
                ctx.runner.pool_state().block_size,
                picture.others,
                picture.num_blocks,
                ctx.t("busy_title"),
                ctx.large,
                words(ctx),
            ),
            "kv-busy-pool",
            memo_key(ctx, "busy"),
        )
    others = picture.requests_before
    freed = picture.freed if len(picture.freed) <= 6 else [*picture.freed[:4], "…", picture.freed[-1]]
    st.caption(
        ctx.t(
            "busy_note",
            others=others,
            last=others - 1,
            freed=", ".join(map(str, freed)),
            layers=ctx.info.layers,
            diff=difference_text(picture.kv_max_diff),
        )
    )
    return picture.block_table


def kv_values(ctx: ViewContext, layer: int, head: int, length: int) -> None:
    """The K or V numbers `layer`'s cache holds for `head`'s K/V head: a sliding-window layer's only from where
    its window (in whole blocks) starts."""
    info = ctx.info
    kv_head = head // info.gqa_group
    which = st.radio(ctx.t("k_or_v"), ["K", "V"], horizontal=True, key=ctx.own_key("kv"))
    if not shown():
        return
    k, v, start = ctx.runner.cached_kv(layer, length)
    if info.window(layer) is not None and start:
        held = len(k)
        st.caption(
            ctx.t("kv_window_held", layer=layer, first=start, last=start + held - 1, w=info.window(layer))
            if held
            else ctx.t("kv_window_empty", layer=layer)
        )
        if not held:
            return
    values = (k if which == "K" else v)[:, kv_head]
    figure(
        lambda: kv_values_figure(
            values.float().cpu().numpy(),
            ctx.labels,
            ctx.t("values_title", which=which, layer=layer, kv=kv_head, head=head),
            ctx.large,
            words(ctx),
            start=start,
        ),
        f"{which}-L{layer}-KV{kv_head}",
        memo_key(ctx, "values", layer, head, which),
    )


def layer_reach(ctx: ViewContext, head: int) -> None:
    """What every layer read at this step (Q head `head`'s newest query over every cached position): a sliding-window
    layer's row blank before its window, where its blocks went back to the pool; a global layer's reaching to 0."""
    trace, info = ctx.trace, ctx.info
    place = Part("reach")
    if not place.shown:
        return
    with place:
        figure(
            lambda: layer_reach_figure(
                layer_reach_frame(
                    trace.attention[:, head, -1].float().numpy(), trace.scores[:, head, -1].float().numpy()
                ),
                info.layer_kinds,
                trace.window_start,
                ctx.t("reach_title", head=head),
                ctx.large,
                words(ctx),
            ),
            f"reach-H{head}",
            memo_key(ctx, "reach", head),
        )


def contexts(ctx: ViewContext) -> None:
    """One token in two contexts (the article's 苹果 in 我吃苹果 and 苹果手机): how alike its K and V are in each
    layer, and the numbers that say why: fixed weights, inputs that carry the context. The chapter's figure on its
    first screen; in the whole view, built only when opened (a press on the KV view costs nothing more)."""
    place = Part("contexts")
    if not place.shown:
        return
    with place:
        if place.height:  # the chapter's text says what the figure shows: the figure alone fits its first screen
            draw_contexts(ctx, explained=False)
            return
        with opened(ctx.t("contexts_open"), "x_contexts") as box:
            if box.open:
                draw_contexts(ctx)


def draw_contexts(ctx: ViewContext, explained: bool = True) -> None:
    try:
        shown = shown_contexts(ctx)
    except InvalidSettingError as error:
        st.info(ctx.t("contexts_unavailable", error=str(error)))
        return
    both = shown.both
    figure(
        lambda: contexts_figure(
            both.key_cosines(),
            both.unrotated_key_cosines(),
            both.value_cosines(),
            ctx.t("contexts_title", word=shown.word),
            ctx.large,
            words(ctx),
        ),
        "kv-contexts",
        memo_key(ctx, "contexts", per_step=False),
    )
    if explained:
        facts = shown.facts()
        st.markdown(ctx.t("contexts_where", **facts))
        st.markdown(ctx.t("contexts_layer0_same" if facts["ctx_rope"] else "contexts_layer0_learned", **facts))


def layer_lengths(ctx: ViewContext, length: int) -> None:
    """Each layer's cached length at a sequence length (a slider, opening past the window; `length` is this run's)
    (a local layer's window against a global layer's all), the bytes the windows save against every layer
    global, and a table per layer."""
    info = ctx.info
    place = Part("layers")  # the figure first; its slider under it
    with place.under:
        at = st.slider(
            ctx.t("lengths_slider"),
            1,
            info.context_limit,
            key=ctx.own_key("lengths_at"),
            value=lengths_default(info, length),
            help=ctx.t("lengths_slider_help", n=length),
        )
    if place.shown:
        with place:
            figure(
                lambda: layer_lengths_figure(
                    layer_lengths_frame(info, at), at, ctx.t("layer_lengths_title", n=at), ctx.large, words(ctx)
                ),
                "kv-layer-lengths",
                memo_key(ctx, "layers", at, per_step=False),
            )
            if info.sliding_window is None:
                st.markdown(ctx.t("window_none", n=at))
            else:
                kept, every = window_saving(info, at)
                st.markdown(
                    ctx.t(
                        "window_saved",
                        n=at,
                        all=fmt_size(every),
                        w=info.sliding_window,
                        kept=fmt_size(kept),
                        saved=fmt_size(every - kept),
                        percent=100 * (every - kept) / every,
                    )
                )
    if shown():
        table(
            shared_table(
                lambda: layer_lengths_table(layer_lengths_frame(info, at), words(ctx)),
                memo_key(ctx, "layers", at, per_step=False),
            )
        )
