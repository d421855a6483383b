"""Where the step's parts go on the page, free or in the lesson, and why a place changes slot with the layout: a
container Streamlit hands back holds the last layout's elements until the run ends."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ui.lesson import panel as lesson
from ui.page.page_state import go_to_chapter
from ui.state.session import page_session, settings


@dataclass
class StepPlaces:
    controls: object  # the counter's line, the step buttons and Play, and the step's warnings
    counter: object
    buttons: object  # where `step_buttons` draws (busy first, live once the step is drawn)
    play: object
    beside: object  # the token stream (and the chapter's text in the lesson)
    chapter_figure: tuple | None  # the lesson's places for the chapter's figure and, under it, its controls


def layout_side() -> bool:
    """Which of its two slots each place of the step's layout takes in this run (`fresh_place`): the other side
    when this run draws another chapter or view than the session's last one did."""
    page, layout = page_session(), (settings.get("chapter"), settings.get("view"))
    if page.drawn_layout != layout:
        page.drawn_layout, page.layout_side = layout, not page.layout_side
    return page.layout_side


def fresh_place(parent, side: bool, key: str | None = None):
    """A container in `parent` that holds nothing of another layout's. Streamlit hands a container drawn where one
    was the old one's elements, and drops those past the new run's last only when the run ends; a timed fragment
    (the leader's status, a follower's banner) starting then left them on screen: the last chapter's figure stayed
    under the new one. So a place has two slots and changes slot with the layout: the slot it leaves is emptied at
    once, and the one it takes held an empty element, not a container."""
    slots = parent.empty(), parent.empty()
    return slots[side].container(key=key)


def step_places(chapter, side: bool) -> StepPlaces:
    """Where the step's parts go. Free exploration: the counter, the step buttons with Play, the token stream, one
    under the other. The lesson: the chapter's title; the counter beside the chapter buttons; the step buttons;
    then the chapter's figure, and beside it the token stream and the chapter's text."""
    if chapter is not None:
        lesson.header(chapter, settings.lang)
    controls = st.container()
    with controls:
        if chapter is None:
            counter = header_place(st)
        else:
            counter_column, back, forward = st.columns([2.6, 1, 1], vertical_alignment="center")
            counter = header_place(counter_column)
            lesson.chapter_buttons(chapter, settings.lang, go_to_chapter, back, forward)
        buttons_column, play_column = st.columns([4, 1], vertical_alignment="center")
    buttons = buttons_column.empty()
    if chapter is None:
        return StepPlaces(controls, counter, buttons, play_column, controls, None)
    figure_column, beside = st.columns([0.65, 0.35])  # the step picture needs 760 px
    return StepPlaces(
        controls,
        counter,
        buttons,
        play_column,
        beside,
        (fresh_place(figure_column, side, "chapter-figure"), fresh_place(figure_column, side, "chapter-controls")),
    )


def header_place(parent):
    """The step's header line, holding the last step's until this step's replaces it: it never blinks out (an
    `st.empty` first would clear it on screen while the step is computed)."""
    shown = page_session().counter_html
    return parent.html(shown) if shown is not None else parent.empty()
