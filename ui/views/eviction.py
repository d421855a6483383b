"""KV eviction: which positions each (layer, KV head) keeps under a policy (after the prefill, or during decode),
where full attention would have looked, the attention sink, the bytes held, and the text beside the full cache's."""

from __future__ import annotations

import math

import streamlit as st

from engine.errors import InvalidSettingError
from engine.eviction import EVICTION_POLICIES
from ui.runs.eviction_forced import ForcedReading
from ui.runs.eviction_settings import EvictionSettings
from ui.runs.sink_experiment import CACHE, SINKS, SinkExperiment
from ui.state.link import EVICT_AT, bounds
from ui.views.chapter_part import Part, shown
from ui.views.context import ViewContext
from ui.views.eviction_shown import EvictionShown, check, error_message, kept_counts, policy_label, shown_eviction
from ui.views.figures import figure, memo_key
from ui.views.widgets import layer_head_pickers, opened, titled, words
from viz.eviction import (
    KEPT,
    bytes_figure,
    cost_figure,
    evicted_share_figure,
    kept_figure,
    kept_over_steps_figure,
    nll_by_position_figure,
    sink_figure,
    sinks_figure,
    text_comparison_html,
)
from viz.style import fmt_size

SMOOTH = 32  # positions each point of the NLL-by-position lines averages


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
        runs = EvictionSettings.of(ctx.state).variants(len(ctx.runner.prompt_ids) - 1)
        what = (
            ctx.t("evict_computing_stream")
            if ctx.state.evict_at == "stream"
            else ctx.t("evict_computing_policies", count=len(runs) - 1)
        )
        with st.spinner(ctx.t("evict_computing", what=what)):
            data = shown_eviction(ctx)
    except InvalidSettingError as error:
        st.warning(error_message(ctx, error))
        return
    policy = policy_label(ctx, data.settings)
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


def cost(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    """Every policy's next-token KL from the full cache, answer token by answer token, and the page's policy's in
    words: what evicting cost the model's predictions."""
    if not shown("cost"):
        return
    with Part("cost"):
        name = lambda run: ctx.t("evict_short_" + run, window=data.settings.window)  # noqa: E731 — legend's short
        lines = {name(run): values for run, values in data.costs().items()}
        chosen = name(data.settings.run_name)
        figure(
            lambda: cost_figure(lines, chosen, ctx.t("evict_cost_title"), ctx.large, words(ctx)),
            "eviction-cost",
            memo_key(ctx, "cost", data.passes, len(lines)),
        )
        st.caption(cost_sentence(ctx, data, policy))
        if data.settings.at != "stream":  # the streaming window is its timing's one run
            st.caption(ctx.t("evict_cost_lab", count=len(lines), total=len(data.pair.lab.variants) - 1))
        forced(ctx, data, policy)


def forced(ctx: ViewContext, data: EvictionShown, policy: str) -> None:
    """The full cache's answer so far read through both caches (`ui.runs.eviction_forced`), while its expander is
    open."""
    with opened(ctx.t("evict_forced_open"), "x_forced") as box:
        if not box.open:
            return
        reading = ctx.runner.forced_reading(data.token_ids(data.pair.full), data.settings)
        with st.spinner(ctx.t("evict_forced_computing")):
            reading.compute()
        st.markdown(forced_sentence(ctx, reading, policy))


def forced_sentence(ctx: ViewContext, reading: ForcedReading, policy: str) -> str:
    full, evicting = round(float(reading.full.mean()), 3), round(float(reading.evicting.mean()), 3)  # as shown
    return ctx.t(
        "evict_forced_more" if evicting >= full else "evict_forced_less",
        n=len(reading.answer),
        policy=policy,
        evicting=f"{evicting:.3f}",
        full=f"{full:.3f}",
        delta=f"{abs(evicting - full):.3f}",
        ppl_evicting=f"{math.exp(evicting):.2f}",
        ppl_full=f"{math.exp(full):.2f}",
    )


def cost_sentence(ctx: ViewContext, data: EvictionShown, policy: str) -> str:
    token, kl, same = data.cost()
    if token < data.passes:  # the texts parted at an earlier token
        return ctx.t("evict_cost_parted", policy=policy, token=token, kl=f"{kl:.3g}")
    return ctx.t(
        "evict_cost_now",
        token=token,
        policy=policy,
        kl=f"{kl:.3g}",
        top=ctx.t("evict_cost_top_same" if same else "evict_cost_top_differs"),
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


def streaming(ctx: ViewContext) -> None:
    """StreamingLLM's experiment on the loaded model (`ui.runs.sink_experiment`), in an expander built only while open:
    it reads a text through ten caches, seconds of work the first time on a server."""
    if not shown():
        return
    with opened(ctx.t("evict_streaming_open", cache=CACHE), "x_streaming") as box:
        if not box.open:
            return
        experiment = ctx.runner.sink_experiment(ctx.state.lang)
        if not experiment.done:
            bar = st.progress(0.0)
            experiment.compute(
                lambda done, total: bar.progress(
                    done / total, text=ctx.t("evict_streaming_computing", done=done, total=total)
                )
            )
            bar.empty()
        draw_streaming(ctx, experiment)


def draw_streaming(ctx: ViewContext, experiment: SinkExperiment) -> None:
    rest = CACHE - 4
    lines = {
        ctx.t("evict_line_full"): experiment.full,
        ctx.t("evict_line_alone", cache=CACHE): experiment.of(0),
        ctx.t("evict_line_sinks", rest=rest): experiment.of(4),
        ctx.t("evict_line_sinks_inside", rest=rest): experiment.of(4, inside=True),
    }
    figure(
        lambda: nll_by_position_figure(
            lines,
            CACHE,
            SMOOTH,
            ctx.t("evict_streaming_by_position_title", smooth=SMOOTH, cache=CACHE),
            ctx.large,
            words(ctx),
        ),
        "eviction-streaming",
        memo_key(ctx, "streaming", per_step=False),
    )
    mean = experiment.after_cache
    written = [mean(experiment.of(n)) for n in SINKS]
    inside = [mean(experiment.of(n, inside=True)) for n in SINKS]
    full = mean(experiment.full)
    figure(
        lambda: sinks_figure(
            SINKS, written, inside, full, ctx.t("evict_streaming_sinks_title", cache=CACHE), ctx.large, words(ctx)
        ),
        "eviction-sinks-count",
        memo_key(ctx, "sinks-count", per_step=False),
    )
    more = lambda nll: f"{mean(nll) - full:.2f}"  # noqa: E731 — nats a token over the full cache
    st.markdown(
        ctx.t(
            "evict_streaming_said",
            tokens=len(experiment.ids),
            cache=CACHE,
            full=f"{full:.2f}",
            alone=more(experiment.of(0)),
            one=more(experiment.of(1)),
            four=more(experiment.of(4)),
            four_inside=more(experiment.of(4, inside=True)),
        )
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
