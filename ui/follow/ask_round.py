"""A round of the class's answers as a page sees it (`AskRound`, in the view's context; `ui.follow.class_answers` and
`ui.follow.class_votes` hold the rules): a prediction of the next token, or a vote on the chapter's question. On the
teacher's page, how many answered and the round's controls (ask, vote, close, reveal, hide a token, ask or vote
again, export); on a student's, the box that sends their guess or vote and what it became; on every page of the room,
the reveal once shown. The intents are the buttons' callbacks: the teacher's in `ask_teacher`, a student's send in
`ask_student`.

Only the leading page changes the round, and only through its own link, which its room publishes: a student's page
holds no control that changes the room. A student's send is taken only while the room, as this server last read it,
has that round open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from ui.follow import class_answers
from ui.follow.ask_student import browser_id, send_guess, send_vote
from ui.follow.ask_teacher import (
    ENDED,
    close_round,
    end_round,
    hide_token,
    open_round,
    open_vote,
    show_round,
    vote_again,
)
from ui.follow.class_answers import Reveal, answers_key, ids_of, tally_of
from ui.follow.class_votes import LETTERS, Question, VoteReveal, moves_from, vote_reveal
from ui.follow.room_link import follow_state, sync
from ui.state.link import AppState


@dataclass(frozen=True)
class AskRound:
    role: str  # "lead" or "follow"
    number: int  # the round (0: none open at this step)
    kind: str  # "predict" or "vote"
    phase: str  # "open", "closed" or "shown"
    predicts: bool  # the page's step is its run's, whose next token the class may predict
    can_ask: bool  # the teacher may ask for a prediction here (the run goes on past this step)
    question: Question | None  # the chapter's, which the class may vote on (None: no chapter)
    mine: tuple[int, bool] | None  # the token or choice this browser sent in this round, and whether the store has it
    message: tuple[str, dict] | None  # the outcome of this page's last send, shown once
    error: str | None  # why the store cannot be used now
    reveal: Reveal | None  # a prediction's, once shown
    vote: VoteReveal | None = None  # a vote's, once shown
    open: Callable[[], None] = field(default=lambda: None)
    open_vote: Callable[[], None] = field(default=lambda: None)
    vote_again: Callable[[], None] = field(default=lambda: None)
    close: Callable[[], None] = field(default=lambda: None)
    show: Callable[[], None] = field(default=lambda: None)
    hide: Callable[[int], None] = field(default=lambda token: None)
    send: Callable[[], None] = field(default=lambda: None)
    export: Callable[[], str] = field(default=lambda: "")


def at_step(state: AppState, step: int) -> AppState:
    """The leader's state at `step`: a round opened at another step or chapter has ended (→ goes on as usual)."""
    mine = follow_state()
    if mine.role != "lead" or not state.ask:
        return state
    if mine.ask_at is None:
        mine.ask_at = (step, state.chapter)  # a reload: the round is the link's, at the link's step
    if mine.ask_at == (step, state.chapter):
        return state
    end_round()
    return replace(state, **ENDED)


def round_for(state: AppState, step: int, runner, question: Question | None, predicts: bool) -> AskRound | None:
    """The round this page shows at `step` (None: it neither leads nor follows a room, or explores on its own; a
    follower waiting for a failing store keeps the teacher's round: a send is kept until the store answers).
    `question`: the chapter's, if the page shows one; `predicts`: whether the page's step is the run's, whose next
    token the class may predict."""
    mine = follow_state()
    if mine.role == "follow" and not mine.tracking or mine.role not in ("lead", "follow"):
        return None
    if not predicts and question is None:
        return None  # a view with a step of its own, outside the lesson: nothing to ask
    vote = state.ask_kind == "vote"
    if state.ask and (vote and question is None or not vote and not predicts):
        state = replace(state, **ENDED)  # a round this page cannot show: a vote outside a chapter, a prediction on a
        # view whose step is not its run's
    room_sync = sync()
    error = mine.error if room_sync is None else room_sync.error
    key = answers_key(mine.code, state.ask)
    mine_sent = None
    if mine.role == "lead":  # the leader's strip says how many answered, each second (`leader.lead_status`)
        mine.ask_counting = (state.ask, state.ask_phase) if state.ask and state.ask_phase != "shown" else None
        answered(room_sync, mine.code, mine.ask_counting)  # read from now on
    if state.ask and room_sync is not None:
        if mine.answer is not None and mine.answer[0] == state.ask:
            mine_sent = (mine.answer[1], room_sync.sent(key, browser_id()))
    message, mine.ask_message = mine.ask_message, None
    revealed = bool(state.ask) and state.ask_phase == "shown"
    shown = reveal_of(state, step, runner) if revealed and not vote else None
    voted = vote_of(state, question) if revealed and vote else None
    if mine.role == "lead" and (shown is not None or voted is not None):
        mine.asked[state.ask] = (
            export_rows(shown, state, step, runner) if shown is not None else vote_rows(voted, question, state, step)
        )
    can_ask = predicts and (not runner.finished or step < runner.generated)
    sends = partial(send_vote, len(question.choices)) if vote else send_guess
    return AskRound(
        mine.role,
        state.ask,
        state.ask_kind,
        state.ask_phase,
        predicts,
        can_ask,
        question,
        mine_sent,
        message,
        error,
        shown,
        voted,
        open_round,
        open_vote,
        vote_again,
        close_round,
        show_round,
        hide_token,
        sends,
        export,
    )


def vote_of(state: AppState, question: Question) -> VoteReveal | None:
    """A vote's reveal from the link (None: its counts are malformed)."""
    counts, before, moves = tally_of(state.ask_tally), tally_of(state.ask_before), moves_from(state.ask_moves)
    if counts is None or before is None or moves is None:
        return None
    return vote_reveal(question.right, len(question.choices), counts, before if state.ask_first else None, moves)


def reveal_of(state: AppState, step: int, runner) -> Reveal | None:
    """The round's reveal from this page's run: the step after `step` picks the token (None: the run ends here)."""
    if runner.advance_to(step + 1) < step + 1:
        return None
    trace = runner.trace(step + 1)
    counts = tally_of(state.ask_tally) or {}
    return class_answers.reveal(
        trace.logits, runner.config.sampling, trace.token_id, counts, ids_of(state.ask_hide) or frozenset()
    )


def answered(room_sync, code: str, counting: tuple[int, str] | None) -> tuple[str, dict] | None:
    """What the leader's strip says of the round it counts (`counting`: its number and phase): how many answered,
    as the rooms' thread last read the round (a strings key and its values)."""
    if counting is None or room_sync is None:
        return None
    tally = room_sync.tally(answers_key(code, counting[0]))
    return "ask_count_" + counting[1], {"n": "…" if tally is None else len(tally)}


def export_rows(shown: Reveal, state: AppState, step: int, runner) -> list[dict]:
    number = round_number(state.ask)
    drawn = {bar.token_id for bar in shown.bars}
    bars = list(shown.bars) + [bar for bar in shown.guesses if bar.token_id not in drawn]  # every guess, too
    cells = runner.candidate_cells(step + 1, [bar.token_id for bar in bars])
    return [
        {
            "chapter": state.chapter or "",
            "round": number,
            "kind": "predict",
            "step": step,
            "answer": "" if bar.hidden else cell.text,
            "token_id": bar.token_id,
            "count": bar.count,
            "probability": f"{bar.probability:.6g}",
            "right": int(bar.picked),
        }
        for bar, cell in zip(bars, cells, strict=True)
    ]


def vote_rows(voted: VoteReveal, question: Question, state: AppState, step: int) -> list[dict]:
    """A vote's rows for the export: one per choice, then, for a vote again, one per change of vote."""
    number = round_number(state.ask)
    kind = "vote again" if voted.before is not None else "vote"
    rows = [
        {
            "chapter": state.chapter,
            "round": number,
            "kind": kind,
            "step": step,
            "answer": f"{LETTERS[i]}. {choice}",
            "count": voted.counts[i],
            "right": int(i == question.right),
        }
        for i, choice in enumerate(question.choices)
    ]
    return rows + [
        {
            "chapter": state.chapter,
            "round": number,
            "kind": "changed",
            "step": step,
            "answer": f"{LETTERS[a]} → {LETTERS[b]}",
            "count": n,
        }
        for (a, b), n in voted.changed.items()
    ]


def round_number(ask: int) -> int:
    """The round's place among the lesson's rounds, in the order asked."""
    asked = list(follow_state().asked)
    return asked.index(ask) + 1 if ask in asked else len(asked) + 1


def export() -> str:
    """The lesson's revealed rounds as CSV, in the order they were asked."""
    asked = follow_state().asked
    return class_answers.export_csv([row for number in asked for row in asked[number]])
