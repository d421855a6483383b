"""The lesson panel: the chapter's explanation with this model's numbers, the article's claim beside them,
a question for the class, and the way to the other chapters."""

from __future__ import annotations

import streamlit as st

from ui.follow.class_votes import LETTERS, Question
from ui.lesson.chapter_facts import current, facts
from ui.lesson.chapters import CHAPTERS, Chapter, fill
from ui.lesson.variants import variants
from ui.text import strings
from ui.views import OWN_STEPS
from ui.views.context import ViewContext

# The chapter's explanation scrolls in its own box beside the figure: the figure never scrolls away under it.
PANEL_HEIGHT = {False: 440, True: 390}


def header(chapter: Chapter, lang: str) -> None:
    """The lesson's one-line header: the chapter's number and title (the page's title while in the lesson)."""
    st.title(f"{chapter.number}/{len(CHAPTERS)} · {chapter.part('title', lang)}")


def chapter_buttons(chapter: Chapter, lang: str, go_to, back, forward) -> None:
    """The way to the chapters before and after (PageUp / PageDown), drawn in the places `back` and `forward`.
    `go_to(n)` is the navigation callback."""
    back.button(
        strings.t("lesson_back", lang),
        key="b_chapter_back",
        on_click=go_to,
        args=(chapter.number - 1,),
        disabled=chapter.number == 1,
        shortcut="PageUp",
        width="stretch",
    )
    forward.button(
        strings.t("lesson_next", lang),
        key="b_chapter_next",
        on_click=go_to,
        args=(chapter.number + 1,),
        disabled=chapter.number == len(CHAPTERS),
        shortcut="PageDown",
        width="stretch",
    )


def stalled(number: int, lang: str, message: str, go_to, use_lesson_prompt) -> None:
    """A chapter whose run cannot start (the class's prompt is too long for this server, say): its header, why,
    the way to the lesson's own prompt, and the chapter buttons: the lesson stays open, in the page's language."""
    chapter = CHAPTERS[number - 1]
    header(chapter, lang)
    back, forward = st.columns(2)
    chapter_buttons(chapter, lang, go_to, back, forward)
    st.error(message)
    st.button(
        strings.t("lesson_use_prompt", lang),
        key="b_lesson_prompt",
        on_click=use_lesson_prompt,
        help=strings.t("lesson_use_prompt_help", lang),
    )


def chapter_text(ctx: ViewContext) -> tuple[Chapter, dict, list[str]] | None:
    """The chapter shown, its facts on this run and the variants that hold (None: the run has no step to quote yet),
    computed once a draw: the panel and the class's vote both read them."""
    chapter = current(ctx)
    if chapter is None or ctx.trace is None and chapter.view not in OWN_STEPS:
        return None
    if "lesson" not in ctx.memo:
        numbers = facts(ctx)
        ctx.memo["lesson"] = (chapter, numbers, variants(chapter, numbers))
    return ctx.memo["lesson"]


def question(ctx: ViewContext) -> Question | None:
    """The chapter's question and its choices on this run, in the chapter's own order, the right one the lesson file
    lists first of the variant that holds (None: no chapter text yet)."""
    shown = chapter_text(ctx)
    if shown is None:
        return None
    chapter, numbers, chosen = shown
    lang = ctx.state.lang
    templates = chapter.choices(lang, chosen)
    order = chapter.choice_order(len(templates))
    return Question(
        fill(chapter.part("question", lang, chosen), numbers),
        tuple(fill(templates[i], numbers) for i in order),
        order.index(0),
    )


def panel(ctx: ViewContext) -> None:
    """The chapter's explanation with this model's and this step's numbers, the article's claim beside them, and
    a question for the class with its choices, in a box of its own height that scrolls. Where a sentence or a
    question holds only on some runs, the chapter's variant that holds on this one (`variants`)."""
    chapter, lang = current(ctx), ctx.state.lang
    with st.container(key="chapter", height=PANEL_HEIGHT[ctx.large], border=True):
        own = chapter.view in OWN_STEPS  # its step is its view's run's: the page's trace and tokens are not shown
        shown = chapter_text(ctx)
        if shown is None:
            st.info(ctx.t("need_prefill"))
            return
        _, numbers, chosen = shown

        def text(part: str) -> str:
            return fill(chapter.part(part, lang, chosen), numbers)

        if not own and chapter.key != "tokens" and ctx.cells[-1].group.state == "unfinished":  # a lone byte chip beside
            st.caption(ctx.t("lesson_unfinished", chip=ctx.cells[-1].group.text))  # the step's header: first, say why
        st.markdown(text("body"))
        if chapter.key == "tokens" and any(cell.group.size > 1 for cell in ctx.cells):
            st.caption(ctx.t("bpe_explained"))  # a character over several tokens is on screen: say why
        st.markdown(f"**{ctx.t('lesson_look')}** {text('look')}")
        st.markdown(f"**{ctx.t('lesson_claim')}** {text('claim')}")
        asked = question(ctx)
        st.markdown(f"**{ctx.t('lesson_question')}** {asked.text}")
        st.markdown("  \n".join(f"**{LETTERS[i]}** · {choice}" for i, choice in enumerate(asked.choices)))
        with st.expander(ctx.t("lesson_answer")):
            st.markdown(f"**{LETTERS[asked.right]}** · {text('answer')}")


def sidebar(number: int, lang: str, go_to) -> None:
    """In the sidebar: the way into the lesson, or the list of chapters and the way out (`number`: the chapter
    in the link, 0 for none)."""
    t = lambda key, **values: strings.t(key, lang, **values)  # noqa: E731
    if not number:
        st.button(
            t("lesson_start"),
            key="b_lesson_start",
            on_click=go_to,
            args=(1,),
            width="stretch",
            help=t("lesson_start_help"),
        )
        return
    # Buttons, not a radio marking the chapter shown: a chapter that keeps the sidebar's settings redraws the step
    # alone, and a radio would go on marking the chapter left (a press on it would then change nothing).
    st.markdown(f"**{t('lesson_chapters')}**")
    with st.container(key="chapter_toc"):
        for chapter in CHAPTERS:
            st.button(
                f"{chapter.number}. {chapter.part('title', lang)}",
                key=f"b_toc_{chapter.number}",
                on_click=go_to,
                args=(chapter.number,),
                type="tertiary",
            )
    st.button(
        t("lesson_leave"), key="b_lesson_leave", on_click=go_to, args=(0,), width="stretch", help=t("lesson_leave_help")
    )
