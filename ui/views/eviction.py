"""KV eviction: which positions each (layer, KV head) keeps under a policy (after the prefill, or during decode),
where full attention would have looked, the attention sink, the bytes held, and the text beside the full cache's. What
evicting cost: `ui.views.eviction_cost`; StreamingLLM's experiment: `ui.views.eviction_streaming`."""

from __future__ import annotations

import streamlit as st

from engine.errors import InvalidSettingError
from engine.eviction import EVICTION_POLICIES
from ui.runs.eviction_settings import EvictionSettings
from ui.state.link import EVICT_AT, bounds
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.eviction_cost import cost
from ui.views.eviction_shown import EvictionShown, check, error_message, kept_counts, policy_label, shown_eviction
from ui.views.eviction_streaming import streaming
from ui.views.figures import figure, memo_key
from ui.views.widgets import ProgressNotice, layer_head_pickers, titled, words
from viz.eviction import (
    KEPT,
    bytes_figure,
    evicted_share_figure,
    kept_figure,
    kept_over_steps_figure,
    sink_figure,
    text_comparison_html,
)
from viz.style import fmt_size


def render(ctx: ViewContext) -> None:
    if not titled(ctx, "evict_title"):
        return
    main = Part("kept", key="main-figure")  # the kept map first; the policy's controls under it
    with main.under:
        own_cache = controls(ctx)
    problem = check(ctx)
    if problem:
        st.warning(problem)
        return
    if ctx.runner.short_of_memory():  # the lab is more runs of the prompt: none is built on a full host
        st.info(ctx.t("short_of_memory", left_out=ctx.t("left_out_eviction")))
        return
    try:
        policy = policy_label(ctx, EvictionSettings.of(ctx.state))  # a lab computes only the policies pages ask for
        # its place made on every run: an element that came only on slow runs would move the ones after it
        notice = ProgressNotice(st.empty(), lambda done: ctx.t("evict_catching_up", done=done, step=ctx.step))
        with st.spinner(ctx.t("evict_computing", what=policy)):
            data = shown_eviction(ctx, notice)
        notice.clear()
    except InvalidSettingError as error:
        st.warning(error_message(ctx, error))
        return
    if main.shown:
        with main:
            kept_map(ctx, data, own_cache, policy)
    notes(ctx, data)
    text(ctx, data, policy)
    cost(ctx, data, policy)
    share(ctx, data)
    sink(ctx, data, policy)
    streaming(ctx)
    held_bytes(ctx, data)
    over_steps(ctx, data)


def controls(ctx: ViewContext) -> bool:
    """The policy, when it evicts and how much; returns whether the map shows the model's own cache instead."""
    state = ctx.state
    left, right = st.columns(2)
    with left:
        st.radio(
            ctx.t("evict_at"),
            EVICT_AT,
            key=ctx.setting_key("evict_at"),
            horizontal=True,
            format_func=lambda at: ctx.t("evict_at_" + at),
        )
        st.selectbox(
            ctx.t("evict_policy"),
            EVICTION_POLICIES,
            key=ctx.setting_key("evict"),
            format_func=lambda p: ctx.t("evict_policy_" + p),
            disabled=state.evict_at == "stream",
            help=ctx.t("evict_policy_help"),
        )
    with right:
        if state.evict_at == "prefill":
            st.slider(
                ctx.t("evict_ratio"),
                *bounds("ratio"),
                key=ctx.setting_key("ratio"),
                step=0.05,
                help=ctx.t("evict_ratio_help"),
            )
        elif state.evict_at == "decode":
            st.number_input(
                ctx.t("evict_budget"),
                *bounds("budget"),
                key=ctx.setting_key("budget"),
                step=1,
                help=ctx.t("evict_budget_help"),
            )
            st.number_input(
                ctx.t("evict_interval"),
                *bounds("interval"),
                key=ctx.setting_key("interval"),
                step=1,
                help=ctx.t("evict_interval_help"),
            )
        else:
            st.number_input(
                ctx.t("evict_window"),
                *bounds("stream_window"),
                key=ctx.setting_key("stream_window"),
                step=1,
                help=ctx.t("evict_window_help"),
            )
        own = st.toggle(ctx.t("evict_own_cache"), key="evict_own_cache", help=ctx.t("evict_own_cache_help"))
    return own


def kept_map(ctx: ViewContext, data: EvictionShown, own_cache: bool, policy: str) -> None:
    record = data.full if own_cache else data.evicting
    title = ctx.t(
        "evict_kept_title_own" if own_cache else "evict_kept_title",
        policy=policy,
        token=data.passes,
        length=record.position + 1,
    )
    figure(
        lambda: kept_figure(record.kept, ctx.info.layer_kinds, title, ctx.large, words(ctx)),
        "eviction-kept",
        memo_key(ctx, "kept", own_cache, data.passes),
    )


def notes(ctx: ViewContext, data: EvictionShown) -> None:
    """What eviction does to the cache here: masked, not freed; positions as rotated; Gemma's built-in window."""
    if not shown():
        return
    info, record = ctx.info, data.evicting
    if data.passes < ctx.step:
        st.caption(ctx.t("evict_ended", passes=data.passes, step=ctx.step))
    if data.capped:
        st.info(ctx.t("evict_capped", steps=data.pair.plan.steps, mb=ctx.runner.step_memory_mb))
    st.caption(
        ctx.t(
            "evict_masked_note",
            allocated=fmt_size(record.allocated_bytes),
            kept=fmt_size(record.kept_bytes),
            full=fmt_size(record.full_bytes),
        )
    )
    st.caption(ctx.t("evict_positions_note"))
    budgets = budgets_note(ctx, data)
    if budgets:
        st.caption(budgets)
    if info.sliding_window is not None:
        kinds = info.layer_kinds
        st.caption(
            ctx.t(
                "evict_window_note",
                local=kinds.count("local"),
                layers=info.layers,
                w=info.sliding_window,
                global_=kinds.count("global"),
                global_layers=", ".join(str(i) for i, k in enumerate(kinds) if k == "global"),
            )
        )


def budgets_note(ctx: ViewContext, data: EvictionShown) -> str | None:
    """How PyramidKV's layers or AdaKV's heads shared the count, read from the pass shown (None: other policies)."""
    info, name = ctx.info, data.settings.policy
    if data.settings.at != "prefill" or name not in ("pyramidkv", "adakv"):
        return None
    if name == "adakv":
        fewest, most = kept_counts(data, info)
        if info.kv_heads == 1:
            return ctx.t("evict_ada_one_head", model=info.name)
        return ctx.t("evict_ada_heads", fewest=fewest, most=most)
    layers = [i for i in range(info.layers) if info.window(i) is None]
    counts = {i: int((data.evicting.kept[i, 0] == KEPT).sum()) for i in layers}
    if len(set(counts.values())) == 1:
        return ctx.t("evict_pyramid_flat", count=counts[layers[0]])
    return ctx.t(
        "evict_pyramid_layers", first=layers[0], most=counts[layers[0]], last=layers[-1], least=counts[layers[-1]]
    )


def text(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    if not shown("text"):
        return
    with Part("text"):
        st.markdown(f"**{ctx.t('evict_text_title')}**")
        common, full_rest, evicting_rest = data.texts()
        st.markdown(text_comparison_html(common, full_rest, evicting_rest, policy, words(ctx)), unsafe_allow_html=True)
        st.caption(
            ctx.t("evict_text_same", n=data.passes)
            if data.difference is None
            else ctx.t("evict_text_differs", token=data.difference + 1)
        )


def share(ctx: ViewContext, data: EvictionShown) -> None:
    if not shown("share"):
        return
    with Part("share"):
        values = data.evicting.evicted_share
        figure(
            lambda: evicted_share_figure(
                values, ctx.info.gqa_group, ctx.t("evict_share_title", token=data.passes), ctx.large, words(ctx)
            ),
            "eviction-share",
            memo_key(ctx, "share", data.passes),
        )


def sink(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    if not shown("sink"):
        return
    with Part("sink"):
        full, evicting = data.sink(data.full), data.sink(data.evicting)
        figure(
            lambda: sink_figure(
                full, evicting, ctx.t("evict_sink_title", token=data.passes, policy=policy), ctx.large, words(ctx)
            ),
            "eviction-sink",
            memo_key(ctx, "sink", data.passes),
        )


def held_bytes(ctx: ViewContext, data: EvictionShown) -> None:
    if not shown("bytes"):
        return
    with Part("bytes"):
        r = data.evicting
        figure(
            lambda: bytes_figure(
                r.full_bytes,
                r.allocated_bytes,
                r.kept_bytes,
                ctx.t("evict_bytes_title", token=data.passes),
                ctx.large,
                words(ctx),
            ),
            "eviction-bytes",
            memo_key(ctx, "bytes", data.passes),
        )


def over_steps(ctx: ViewContext, data: EvictionShown) -> None:
    """One (layer, KV head) pass by pass: decode-time eviction moves what it keeps as the answer grows."""
    place = Part("steps")
    with place.under:
        layer, head = layer_head_pickers(ctx)
    if not place.shown:
        return
    kv_head = head // ctx.info.gqa_group
    with place:
        history = data.history(layer, kv_head)
        figure(
            lambda: kept_over_steps_figure(
                history, 1, ctx.t("evict_steps_title", layer=layer, kv=kv_head, head=head), ctx.large, words(ctx)
            ),
            f"eviction-steps-L{layer}-KV{kv_head}",
            memo_key(ctx, "steps", layer, kv_head, data.passes),
        )
