"""The sidebar: the lesson's chapters (or the way into it), every setting the link carries, and Play's pace. Each
widget starts from the setting's current value, so a widget a browser draws anew under load changes nothing."""

from __future__ import annotations

import streamlit as st

from ui.host.limits import Limits
from ui.lesson import panel as lesson
from ui.page import page_state
from ui.page.page_state import go_to_chapter, labels, t
from ui.state.link import LANGS, MAX_PROMPT_CHARS, REUSE_POLICIES, bounds
from ui.state.session import page_controls, settings
from ui.text import strings


def sidebar(limits: Limits, can_think: bool = False, can_chat: bool = True) -> None:
    """The lesson's chapters (or the way into it), then the settings. can_think: the model's chat template has a
    thinking switch (Qwen3), so the Thinking toggle shows; can_chat: it has a chat template at all (a base model
    has none: the chat switch is off and greyed).

    Each setting's widget is given its current value as its default (`value=`, a selectbox's `index=`). Under a
    class's load a browser can draw a sidebar widget anew, without the value it held (seen in the 30-page load
    test: a page's prompt turned "", or chat, top-p and block size turned to off and their minimums, with nobody
    touching them); such a widget starts from its default and sends it back as a change. With the current value
    as the default, that change changes nothing."""
    with st.sidebar:
        lesson.sidebar(settings.get("chapter", 0), settings.lang, go_to_chapter)
        st.selectbox(
            t("language"),
            LANGS,
            key=settings.key("lang"),
            index=LANGS.index(settings.lang),
            format_func=lambda code: strings.LANGUAGE_NAMES[code],
            on_change=page_state.switch_language,
        )
        st.toggle(t("large_text"), **held("large"))
        if limits.allow_any_model:
            st.text_input(t("model"), **held("model"), help=t("model_help_any"))
        else:
            options = list(limits.models)
            if settings.model not in options:
                settings.model = "embedded"
            st.selectbox(
                t("model"),
                options,
                key=settings.key("model"),
                index=options.index(settings.model),
                help=t("model_help"),
            )
        st.text_area(t("prompt"), **held("prompt"), height=120, max_chars=MAX_PROMPT_CHARS)
        st.toggle(
            t("chat"), **held("chat"), help=t("chat_help" if can_chat else "chat_none_help"), disabled=not can_chat
        )
        if can_think:
            st.toggle(t("think"), **held("think"), help=t("think_help"), disabled=not settings.chat)
        st.markdown(f"**{t('sampling')}**")
        st.slider(
            t("temperature"), *bounds("temperature"), **held("temperature"), step=0.05, help=t("temperature_help")
        )
        st.number_input("top-k", *bounds("top_k"), **held("top_k"), step=1, help=t("top_k_help"))
        st.slider("top-p", *bounds("top_p"), **held("top_p"), step=0.01, help=t("top_p_help"))
        st.number_input(t("seed"), *bounds("seed"), **held("seed"), step=1)
        st.markdown(f"**{t('cache')}**")
        st.number_input(t("block_size"), *bounds("block_size"), **held("block_size"), step=1, help=t("block_size_help"))
        st.number_input(t("kv_splits"), *bounds("kv_splits"), **held("kv_splits"), step=1, help=t("kv_splits_help"))
        st.selectbox(
            t("policy"),
            REUSE_POLICIES,
            key=settings.key("policy"),
            index=REUSE_POLICIES.index(settings.policy),
            format_func=labels("policy_"),
        )


def held(name: str) -> dict:
    """Setting `name`'s widget arguments: its key, and its current value as its default (why: `sidebar`)."""
    return {"key": settings.key(name), "value": settings[name]}


def play_controls(limits: Limits) -> None:
    """The pace, with the settings in the sidebar; the Play toggle sits in the step buttons' row (`draw_step`)."""
    page_controls.setdefault("pace", max(limits.min_pace, 0.8))
    st.sidebar.slider(
        t("pace"), limits.min_pace, 3.0, key=page_controls.key("pace"), value=page_controls.pace, step=0.1
    )  # value: see sidebar
