"""The lesson panel: the chapter's explanation with this model's numbers, the article's claim beside them,
a question for the class, and the way to the other chapters."""

from __future__ import annotations

import streamlit as st

from engine.kv_cache import kv_bytes_per_token
from engine.reference_models import reference_info
from engine.split_kv import worked_example
from engine.timing import crossover_batch, crossover_context, decode_step_bytes, weight_bytes_read
from ui import strings
from ui.strings import Shown
from ui.context import ViewContext
from ui.lesson import CHAPTERS, Chapter
from ui.views.common import shown_layer_head
from viz.kv_cache import difference_text, lengths_default, window_saving
from viz.split_kv import vector_text
from viz.style import fmt_size


class _Missing:
    """A number this step does not have (e.g. no split before the prefill): shown as a dash, whatever its format."""

    def __format__(self, spec: str) -> str:
        return "–"


class _Facts(dict):
    def __missing__(self, key: str) -> _Missing:
        return _Missing()


def fill(template: str, facts: dict) -> str:
    """A chapter's Markdown with this model's facts; text values show as text, as in `ui.strings.t`."""
    return template.format_map(_Facts(strings.as_text(facts)))


def facts(ctx: ViewContext) -> dict:
    """The loaded model's and this step's own numbers, by the names the chapters' placeholders use."""
    info, trace, runner = ctx.info, ctx.trace, ctx.runner
    n = len(runner.prompt_ids)
    out = dict(
        name=info.name, layers=info.layers, adds=2 * info.layers, hidden=info.hidden, vocab=info.vocab,
        q_heads=info.q_heads, kv_heads=info.kv_heads, group=info.gqa_group, head_dim=info.head_dim,
        concat=info.q_heads * info.head_dim, kv_bytes=info.kv_bytes_per_token, dtype=info.dtype,
        mha_bytes=kv_bytes_per_token(info.layers, info.q_heads, info.head_dim, info.element_bytes),
        element=info.element_bytes, limit=info.context_limit, n=n, n_tokens=ctx.t("count_tokens", n=n),
        n_but_one=n - 1, step=ctx.step, block_size=ctx.state.block_size,
        positions_note=ctx.t("lesson_positions_learned" if info.positions == "learned" else "lesson_positions_rope"),
    )
    if trace is not None:
        context = trace.context_length
        out.update(id=trace.token_id, token=ctx.cells[-1].text, inputs=len(trace.input_ids),
                   context=context, position=trace.positions[-1], blocks=len(trace.block_table),
                   kv_kib=info.kv_bytes(context) / 1024, read_mib=info.kv_bytes(context) / 2**20)
        out.update(cost_facts(info, context))
        out.update(window_facts(ctx, context))
        if ctx.state.pool == "busy":
            out.update(busy_facts(runner.busy_pool(ctx.step)))
        if trace.split is not None:
            out.update(split_facts(ctx))
        out.update(inputs_tokens=ctx.t("count_tokens", n=len(trace.input_ids)))
    hit = runner.prefix_hit()
    if hit is not None:
        out.update(reused=hit.reused_tokens, computed=hit.computed_tokens,
                   reuse_note=ctx.t("lesson_reuse_note", reused=hit.reused_tokens, computed=hit.computed_tokens)
                   if hit.reused_tokens else "")
    closest = runner.closest_cached()
    if closest is not None:
        out.update(cached_n=len(closest[0]), first=closest[1])
        out.update({policy: reuse.reused_tokens for policy, reuse in runner.policy_reuse().items()})
    return out


def cost_facts(info, context: int) -> dict:
    """What one decode step reads at `context` positions, for this model and Qwen3-0.6B (chapter 10): the weights,
    and the batch (or context) from which the K/V passes them."""
    qwen = reference_info("Qwen3-0.6B")
    batch = crossover_batch(info, context)
    return dict(
        weights_mib=weight_bytes_read(info) / 2**20, cross_batch=batch,
        cross_batch_mib=decode_step_bytes(info, context, batch) / 2**20,
        cross_batch_double=crossover_batch(info, 2 * context), cross_context=crossover_context(info, 1),
        limit_batch=crossover_batch(info, info.context_limit),
        qwen_weights_mib=weight_bytes_read(qwen) / 2**20, qwen_kv_kib=qwen.kv_bytes_per_token / 1024,
        qwen_cross_context=crossover_context(qwen, 1), qwen_cross_batch=crossover_batch(qwen, context))


def window_facts(ctx: ViewContext, context: int) -> dict:
    """Which layers keep the whole history and which only a sliding window (the chapter on it), at the length the
    KV view's per-layer picture opens at; for a model without windows, what it keeps instead."""
    info = ctx.info
    at = lengths_default(info, context)
    kept, every = window_saving(info, at)
    kinds = info.layer_kinds
    window = info.sliding_window
    if window is None:
        note = ctx.t("lesson_window_none", layers=info.layers, at=at, all_at=Shown(fmt_size(every)))
    else:
        inside = ctx.t("lesson_window_inside" if context <= window else "lesson_window_past")
        note = ctx.t("lesson_window_local", local=kinds.count("local"), window=window, global_=kinds.count("global"),
                     context=context, inside=inside, at=at, all_at=Shown(fmt_size(every)),
                     kept_at=Shown(fmt_size(kept)), percent_at=100 * (every - kept) / every)
    return dict(window_note=note, window_at=at)


def busy_facts(picture) -> dict:
    """This run replayed in a pool other requests used first (chapter 9): where its first blocks landed."""
    table = picture.block_table
    shown = ", ".join(f"{logical} → {physical}" for logical, physical in enumerate(table[:4]))
    return dict(busy_map=Shown(shown + (", …" if len(table) > 4 else "")),
                busy_diff=Shown(difference_text(picture.kv_max_diff)), busy_others=picture.requests_before)


def split_facts(ctx: ViewContext) -> dict:
    """Split-KV as the split view beside the chapter shows it (its layer and head, its difference), the largest
    difference over all layers and heads with where it is, and the view's worked example (our own inputs)."""
    split = ctx.trace.split
    layer, head = shown_layer_head(ctx)
    diffs = split.max_abs_diff
    top_layer, top_head = divmod(int(diffs.argmax()), diffs.shape[1])
    sizes = dict(layers=diffs.shape[0], heads=diffs.shape[1])
    note = (ctx.t("lesson_split_max_here", **sizes) if (top_layer, top_head) == (layer, head) else
            ctx.t("lesson_split_max_elsewhere", **sizes, diff=diffs.max().item(), layer=top_layer, head=top_head))
    example = worked_example()
    return dict(splits=len(split.ranges), layer=layer, head=head, diff=diffs[layer, head].item(), diff_all_note=note,
                example_merged=Shown(vector_text(example.merged, 3)), example_unsplit=Shown(vector_text(example.unsplit, 3)))


def current(ctx: ViewContext) -> Chapter | None:
    number = ctx.state.chapter
    return CHAPTERS[number - 1] if number else None


# The chapter's explanation scrolls in its own box beside the figure: the figure never scrolls away under it.
PANEL_HEIGHT = {False: 440, True: 390}


def header(chapter: Chapter, lang: str) -> None:
    """The lesson's one-line header: the chapter's number and title (the page's title while in the lesson)."""
    st.title(f"{chapter.number}/{len(CHAPTERS)} · {chapter.part('title', lang)}")


def chapter_buttons(chapter: Chapter, lang: str, go_to, back, forward) -> None:
    """The way to the chapters before and after (PageUp / PageDown), drawn in the places `back` and `forward`.
    `go_to(n)` is the navigation callback."""
    back.button(strings.t("lesson_back", lang), key="b_chapter_back", on_click=go_to, args=(chapter.number - 1,),
                disabled=chapter.number == 1, shortcut="PageUp", width="stretch")
    forward.button(strings.t("lesson_next", lang), key="b_chapter_next", on_click=go_to, args=(chapter.number + 1,),
                   disabled=chapter.number == len(CHAPTERS), shortcut="PageDown", width="stretch")


def panel(ctx: ViewContext) -> None:
    """The chapter's explanation with this model's and this step's numbers, the article's claim beside them, and
    a question for the class, in a box of its own height that scrolls."""
    chapter, lang = current(ctx), ctx.state.lang
    with st.container(key="chapter", height=PANEL_HEIGHT[ctx.large], border=True):
        if ctx.trace is None:
            st.info(ctx.t("need_prefill"))
            return
        numbers = facts(ctx)
        st.markdown(fill(chapter.part("body", lang), numbers))
        if chapter.key == "tokens" and any(cell.group.size > 1 for cell in ctx.cells):
            st.caption(ctx.t("bpe_explained"))  # a character over several tokens is on screen: say why
        st.markdown(f"**{ctx.t('lesson_look')}** {fill(chapter.part('look', lang), numbers)}")
        st.markdown(f"**{ctx.t('lesson_claim')}** {fill(chapter.part('claim', lang), numbers)}")
        st.markdown(f"**{ctx.t('lesson_question')}** {fill(chapter.part('question', lang), numbers)}")
        with st.expander(ctx.t("lesson_answer")):
            st.markdown(fill(chapter.part("answer", lang), numbers))


def sidebar(number: int, lang: str, go_to) -> None:
    """In the sidebar: the way into the lesson, or the list of chapters and the way out (`number`: the chapter
    in the link, 0 for none)."""
    t = lambda key, **values: strings.t(key, lang, **values)  # noqa: E731
    if not number:
        st.button(t("lesson_start"), key="b_lesson_start", on_click=go_to, args=(1,), width="stretch",
                  help=t("lesson_start_help"))
        return
    # Buttons, not a radio marking the chapter shown: a chapter that keeps the sidebar's settings redraws the step
    # alone, and a radio would go on marking the chapter left (a press on it would then change nothing).
    st.markdown(f"**{t('lesson_chapters')}**")
    with st.container(key="chapter_toc"):
        for chapter in CHAPTERS:
            st.button(f"{chapter.number}. {chapter.part('title', lang)}", key=f"b_toc_{chapter.number}",
                      on_click=go_to, args=(chapter.number,), type="tertiary")
    st.button(t("lesson_leave"), key="b_lesson_leave", on_click=go_to, args=(0,), width="stretch",
              help=t("lesson_leave_help"))
