"""The class answers, under the step buttons of a page in a room (`ctx.ask`, `ui.follow.ask_round`): on the teacher's
page the round's controls and how many answered; on a student's, the box for a guess and the token it became, or the
chapter's question and its choices; on every page, once revealed, the round in one sentence and its figure: the
class's guesses beside the model's probabilities, or the votes per choice (after a vote again, beside the first).
Guesses reach the class only as tokens with counts: a token is drawn as the model's text, never as Markdown."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui.follow.ask_student import GUESS_KEY, VOTE_KEY
from ui.follow.class_answers import MAX_GUESS_CHARS
from ui.follow.class_votes import LETTERS
from ui.views.context import ViewContext
from ui.views.figures import figure, memo_key
from ui.views.widgets import opened, words
from viz.reveal import reveal_figure, vote_figure
from viz.style import fmt_probability
from viz.tokens import position_label

PHASES = ("", "open", "closed", "shown")


def part(ctx: ViewContext, here: bool = True) -> None:
    """The round in a place of its phase's own: a place drawn where another phase's was would keep that one's
    elements past its own last until the run ends, and a timed fragment starting then (the leader's status, a
    follower's banner) left them on screen (a reveal under the next step's Ask button). The places of the other
    phases are empty elements, emptied at once; a page that draws the round in one of two places (`here`) leaves
    the other's all empty."""
    ask = ctx.ask
    if ask is None:
        return
    slots = [st.empty() for _ in PHASES]
    if not here:
        return
    with slots[PHASES.index(ask.phase if ask.number else "")].container(key="ask"):
        if ask.error and ask.number and ask.phase != "shown":
            st.warning(ctx.t("ask_store_down", error=ask.error))
        if ask.message is not None:
            key, values = ask.message
            (st.success if key == "ask_sent" else st.warning)(ctx.t(key, **values))
        if ask.role == "lead":
            teachers_controls(ctx)
        elif ask.number and ask.phase != "shown":
            (students_ballot if ask.kind == "vote" else students_box)(ctx)
        if ask.number and ask.phase == "shown":
            (revealed_vote if ask.kind == "vote" else revealed)(ctx)


def labels(ctx: ViewContext, bars) -> list[str]:
    """What each token reads as at the step the class predicted ("" for a token the teacher hid)."""
    cells = ctx.runner.candidate_cells(ctx.step + 1, [bar.token_id for bar in bars])
    return ["" if bar.hidden else position_label(cell) for bar, cell in zip(bars, cells, strict=True)]


def teachers_controls(ctx: ViewContext) -> None:
    ask = ctx.ask
    row = st.container(horizontal=True, vertical_alignment="center")
    if not ask.number:
        if ask.predicts:
            row.button(
                ctx.t("ask_open"),
                key="b_ask_open",
                on_click=ask.open,
                disabled=not ask.can_ask,
                icon=":material/quiz:",
                shortcut="Q",
                help=ctx.t("ask_open_help" if ask.can_ask else "ask_at_end"),
            )
        if ask.question is not None:
            row.button(
                ctx.t("vote_open"),
                key="b_vote_open",
                on_click=ask.open_vote,
                icon=":material/ballot:",
                shortcut="B",
                help=ctx.t("vote_open_help"),
            )
        return
    if ask.phase == "shown":
        if ask.kind == "vote":
            row.button(
                ctx.t("vote_again"),
                key="b_vote_again",
                on_click=ask.vote_again,
                icon=":material/replay:",
                help=ctx.t("vote_again_help"),
            )
        else:
            row.button(
                ctx.t("ask_again"),
                key="b_ask_again",
                on_click=ask.open,
                icon=":material/replay:",
                help=ctx.t("ask_again_help"),
            )
        row.download_button(
            ctx.t("ask_export"),
            ask.export,
            file_name="kvscope-class-answers.csv",
            mime="text/csv",
            key="dl_ask",
            icon=":material/download:",
        )
        return
    row.markdown(ctx.t("ask_phase_" + ask.phase))  # how many answered: live in the leader's strip (`leader.py`)
    if ask.phase == "open":
        row.button(ctx.t("ask_close"), key="b_ask_close", on_click=ask.close, icon=":material/lock:")
    row.button(
        ctx.t("ask_reveal"),
        key="b_ask_reveal",
        on_click=ask.show,
        type="primary",
        icon=":material/visibility:",
        shortcut="V",
    )


def students_box(ctx: ViewContext) -> None:
    ask = ctx.ask
    if ask.mine is not None:
        token, received = ask.mine
        label = position_label(ctx.runner.candidate_cells(ctx.step + 1, [token])[0])
        st.info(ctx.t("ask_yours_received" if received else "ask_yours_kept", token=label))
    if ask.phase != "open":
        st.caption(ctx.t("ask_closed_wait"))
        return
    with st.form("ask-form", clear_on_submit=False, border=False):
        st.markdown(f"**{ctx.t('ask_box_title')}**")
        st.text_input(
            ctx.t("ask_box_label"),
            key=GUESS_KEY,
            max_chars=MAX_GUESS_CHARS,
            help=ctx.t("ask_box_help", most=MAX_GUESS_CHARS),
        )
        st.form_submit_button(ctx.t("ask_send"), on_click=ask.send, icon=":material/send:")


def choice_label(ask, choice: int) -> str:
    return f"{LETTERS[choice]} · {ask.question.choices[choice]}"


def students_ballot(ctx: ViewContext) -> None:
    """The chapter's question and its choices, on a student's page while the vote is open."""
    ask = ctx.ask
    if ask.mine is not None:
        choice, received = ask.mine
        st.info(ctx.t("vote_yours_received" if received else "vote_yours_kept", choice=LETTERS[choice]))
    if ask.phase != "open":
        st.caption(ctx.t("ask_closed_wait"))
        return
    with st.form("vote-form", clear_on_submit=False, border=False):
        st.markdown(f"**{ctx.t('vote_box_title')}** {ask.question.text}")
        st.radio(
            ctx.t("vote_box_label"),
            range(len(ask.question.choices)),
            index=None,
            key=VOTE_KEY,
            format_func=lambda choice: choice_label(ask, choice),
        )
        st.form_submit_button(ctx.t("ask_send"), on_click=ask.send, icon=":material/send:")


def revealed_vote(ctx: ViewContext) -> None:
    """A vote in one sentence, then its figure; after a vote again, beside the first, and who changed their answer."""
    ask, shown = ctx.ask, ctx.ask.vote
    if shown is None:
        return
    key, values = shown.sentence
    st.markdown(f"**{ctx.t(key, choice=LETTERS[shown.right], **values)}**")
    if ask.mine is not None and ask.role != "lead":
        st.caption(ctx.t("vote_yours_revealed", choice=LETTERS[ask.mine[0]]))
    st.markdown("  \n".join(choice_label(ask, i) for i in range(len(shown.counts))))  # the figure names letters
    title = ctx.t("vote_reveal_title_again" if shown.before is not None else "vote_reveal_title")
    letters = list(LETTERS[: len(shown.counts)])
    figure(
        lambda: vote_figure(shown.counts, shown.before, shown.right, letters, title, ctx.large, words(ctx)),
        "vote",
        memo_key(ctx, "vote"),
    )
    st.caption(ctx.t("vote_caption"))
    if shown.changed:
        table = {
            ctx.t("vote_col_from"): [LETTERS[a] for a, _ in shown.changed],
            ctx.t("vote_col_to"): [LETTERS[b] for _, b in shown.changed],
            ctx.t("vote_col_count"): list(shown.changed.values()),
        }
        st.dataframe(pd.DataFrame(table), hide_index=True)


def revealed(ctx: ViewContext) -> None:
    """The round in one sentence, then the figure; on the teacher's page a ✕ hides a token the class should not see."""
    ask, shown = ctx.ask, ctx.ask.reveal
    if shown is None:
        st.info(ctx.t("ask_run_ends"))
        return
    key, values = shown.sentence
    if "favourites" in values:
        favourites = values.pop("favourites")
        names = labels(ctx, favourites)
        values["token"] = ", ".join(ctx.t("reveal_hidden_token") if not name else f"“{name}”" for name in names)
        values["p"] = ", ".join(fmt_probability(bar.probability) for bar in favourites)
    st.markdown(f"**{ctx.t(key, **values)}**")
    mine = next((bar for bar in shown.guesses if ask.mine and bar.token_id == ask.mine[0]), None)
    if mine is not None:  # a student's own guess, among the class's
        st.caption(
            ctx.t(
                "ask_yours_revealed",
                token=labels(ctx, [mine])[0] or ctx.t("reveal_hidden_token"),
                n=mine.count,
                p=fmt_probability(mine.probability),
            )
        )
    bar_labels = labels(ctx, shown.bars)
    figure(
        lambda: reveal_figure(shown.bars, bar_labels, shown.answered, ctx.t("ask_reveal_title"), ctx.large, words(ctx)),
        "reveal",
        memo_key(ctx, "reveal"),
    )
    st.caption(ctx.t("ask_reveal_caption"))
    with opened(ctx.t("ask_all_guesses", n=len(shown.guesses)), "x_ask_guesses") as box:
        if box.open:
            guessed = labels(ctx, shown.guesses)
            table = {
                ctx.t("ask_col_token"): [g or ctx.t("reveal_hidden_token") for g in guessed],
                ctx.t("ask_col_count"): [bar.count for bar in shown.guesses],
                ctx.t("ask_col_p"): [fmt_probability(bar.probability) for bar in shown.guesses],
            }
            st.dataframe(pd.DataFrame(table), hide_index=True)
            if ask.role == "lead":
                hide_row = st.container(horizontal=True)
                for bar, name in zip(shown.guesses, guessed, strict=True):
                    if not bar.hidden:
                        hide_row.button(
                            f"✕ {name}",
                            key=f"b_ask_hide_{bar.token_id}",
                            on_click=ask.hide,
                            args=(bar.token_id,),
                            help=ctx.t("ask_hide_help"),
                        )
