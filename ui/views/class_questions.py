"""The Serving view's part for a class in a follow room (`ctx.room`, `ui.follow.serving_room`): on a student's page,
where their own question is in the pool, and the box that sends it (once, after they agreed the class will see it); on
the teacher's, the class's list, ✕ to remove a question, and serving the list as a round or going back to the
samples. Questions are the students' text: shown as text, never as Markdown or HTML."""

from __future__ import annotations

import streamlit as st

from engine.server import StepReport
from ui.follow.class_prompts import MAX_CHARS
from ui.follow.serving_room import CONSENT_KEY, PROMPT_KEY
from ui.views.context import ViewContext
from viz.serving import request_label


def where_mine_is(ctx: ViewContext, report: StepReport | None) -> None:
    """A student's question in the round served: which request it is and which blocks hold it at this step."""
    room = ctx.room
    mine = room.my_request if room else None
    if mine is None:
        return
    label = request_label(mine)
    state = next((s for s in report.requests if s.id == mine), None) if report else None
    if state is None or (state.status == "waiting" and not state.blocks):
        st.info(ctx.t("class_mine_waiting", request=label))
    elif state.status == "finished":
        st.info(ctx.t("class_mine_done", request=label))
    else:
        own = [b for b in state.blocks if len(report.owners[b]) == 1]
        shared = [b for b in state.blocks if len(report.owners[b]) > 1]
        st.info(
            ctx.t(
                "class_mine_blocks" if shared else "class_mine_blocks_own",
                request=label,
                own=", ".join(map(str, own)) or "–",
                shared=", ".join(map(str, shared)),
            )
        )


def room_part(ctx: ViewContext) -> None:
    room = ctx.room
    if room is None:
        return
    if room.error:
        st.warning(ctx.t("class_prompt_store_down", error=room.error))
    if room.gone:
        st.info(ctx.t("class_round_gone", round=ctx.state.serve_round))
    if room.message is not None:
        key, values = room.message
        (st.success if key == "class_prompt_sent" else st.warning)(ctx.t(key, **values))
    if room.role == "lead":
        teachers_list(ctx)
    else:
        students_box(ctx)


def students_box(ctx: ViewContext) -> None:
    room = ctx.room
    st.markdown(f"**{ctx.t('class_send_title')}**")
    if room.my_text is not None:
        st.caption(ctx.t("class_prompt_yours"))
        st.text(room.my_text)
        return
    st.caption(ctx.t("class_send_help"))
    st.text_input(ctx.t("class_prompt_label"), key=PROMPT_KEY, help=ctx.t("class_prompt_label_help", most=MAX_CHARS))
    consent = st.checkbox(ctx.t("class_consent"), key=CONSENT_KEY)
    st.button(ctx.t("class_send"), key="b_class_send", on_click=room.send, disabled=not consent)


def teachers_list(ctx: ViewContext) -> None:
    room = ctx.room
    st.markdown(f"**{ctx.t('class_list_title', n=len(room.prompts))}**")
    st.caption(ctx.t("class_list_help"))
    with st.container(key="class-questions"):
        for i, prompt in enumerate(room.prompts):
            text, remove = st.columns([12, 1], vertical_alignment="center")
            text.text(f"{i + 1}. {prompt.text}")
            remove.button(
                "✕",
                key=f"b_class_remove_{i}",
                on_click=room.remove,
                args=(prompt.sender,),
                help=ctx.t("class_remove_help"),
            )
    row = st.container(horizontal=True)
    row.button(
        ctx.t("class_serve", n=len(room.prompts)), key="b_class_serve", on_click=room.serve, disabled=not room.prompts
    )
    row.button(ctx.t("class_samples"), key="b_class_samples", on_click=room.samples, disabled=not ctx.state.serve_round)
