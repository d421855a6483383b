"""The class's room as the Serving view reads it (`ServingRoom`, in the view's context): on a student's page, the box
that sends their one question; on the teacher's, the class's list, a way to remove any, and to serve it as a round
(`ui.follow.class_prompts`); on every page of the room, the round the link names (`serve_round`), which the view
serves instead of the samples. What the view may do here, it does through the room's intents (send, remove, serve,
back to the samples), called as its buttons' callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.prompt import control_texts
from ui.follow import class_prompts
from ui.follow.class_prompts import ClassPrompt, ClassPrompts, PromptRefused, ServedRound
from ui.follow.room_link import follow_state, sync
from ui.follow.rooms import new_page_id
from ui.follow.store import StoreError
from ui.runs.serving import CLASS_MAX_TOKENS, OPENING, wrapped
from ui.state.link import AppState
from ui.state.session import page_session, settings, view_controls

SEND_GAP_SECONDS = 2.0  # a page's sends: one press every so often; a flood of presses is refused, not stored
PROMPT, CONSENT = "class_prompt", "class_consent"  # the student's box and the consent it asks first (view controls)
PROMPT_KEY, CONSENT_KEY = view_controls.key(PROMPT), view_controls.key(CONSENT)
clock = time.monotonic  # tests move it by hand


@dataclass(frozen=True)
class ServingRoom:
    role: str  # "lead" (the teacher's page) or "follow" (a student's)
    prompts: tuple[ClassPrompt, ...]  # the class's list now
    served: ServedRound | None  # the round the link names (None: the samples)
    gone: bool  # the link names a round the store no longer holds (the samples are served)
    mine: str  # this page's sender id ("": it sent nothing)
    message: tuple[str, dict] | None  # the outcome of this page's last send: a strings key and its values
    error: str | None  # why the store could not be read
    send: Callable[[], None] = field(default=lambda: None)
    remove: Callable[[str], None] = field(default=lambda sender: None)
    serve: Callable[[], None] = field(default=lambda: None)
    samples: Callable[[], None] = field(default=lambda: None)

    @property
    def my_request(self) -> int | None:
        """Which request of the round served is this page's question (its index), if any."""
        if not self.served or not self.mine:
            return None
        return next((i for i, p in enumerate(self.served.prompts) if p.sender == self.mine), None)

    @property
    def my_text(self) -> str | None:
        """The question this page has in the class's list now."""
        return next((p.text for p in self.prompts if p.sender == self.mine), None) if self.mine else None


def prompts_store() -> ClassPrompts | None:
    room_sync = sync()
    return None if room_sync is None else ClassPrompts(room_sync.rooms.store)


def room_for(state: AppState) -> ServingRoom | None:
    """The room of this page (None: it neither leads nor follows one), as the Serving view shows it."""
    mine = follow_state()
    if mine.role not in ("lead", "follow") or not mine.code:
        return None
    store, error, prompts, served = prompts_store(), mine.error, (), None
    try:
        if store is not None:
            prompts = tuple(store.prompts(mine.code))
            served = store.round(mine.code, state.serve_round) if state.serve_round else None
    except StoreError as failure:
        error = str(failure)
    message, mine.prompt_message = mine.prompt_message, None  # shown once
    return ServingRoom(
        mine.role,
        prompts,
        served,
        bool(state.serve_round) and served is None and error is None,
        mine.prompt_sender,
        message,
        error,
        send_prompt,
        remove_prompt,
        serve_round,
        serve_samples,
    )


def served_round(state: AppState) -> ServedRound | None:
    """The round of the class's questions this page serves: the link's, from its room's store (None: the samples,
    also where the page has no room or the store no longer holds the round)."""
    mine = follow_state()
    store = prompts_store() if state.serve_round and mine.role in ("lead", "follow") and mine.code else None
    try:
        return None if store is None else store.round(mine.code, state.serve_round)
    except StoreError:
        return None


def send_prompt() -> None:
    """A student's Send: their question, checked, into the class's list; what happened, for the next draw."""
    mine = follow_state()
    now, last = clock(), mine.prompt_tried_at
    mine.prompt_tried_at = now
    try:
        if last is not None and now - last < SEND_GAP_SECONDS:
            raise PromptRefused("too_fast", seconds=SEND_GAP_SECONDS)
        if not view_controls.get(CONSENT):
            raise PromptRefused("consent")
        text = checked(str(view_controls.get(PROMPT, "")))
        store = prompts_store()
        if store is None:
            raise StoreError(mine.error or "no store")
        sender = mine.prompt_sender or new_page_id()
        place = store.send(mine.code, sender, text)
        mine.prompt_sender = sender
        view_controls[PROMPT] = ""
        mine.prompt_message = ("class_prompt_sent", {"place": place})
    except PromptRefused as refused:
        mine.prompt_message = ("class_prompt_" + refused.reason, refused.values)
    except StoreError as failure:
        mine.prompt_message = ("class_prompt_store_down", {"error": str(failure)})


def checked(text: str) -> str:
    """The question as text (`class_prompts.check_text`, against the loaded model's control tokens), and within the
    host's prompt limit once wrapped as the Serving view wraps it, in whichever language the teacher serves it."""
    runner = page_session().runner
    model = runner.model
    text = class_prompts.check_text(text, control_texts(model.tokenizer))
    tokens = max(len(wrapped(model, lang, runner.config.chat, text)) for lang in OPENING)
    most = min(runner.limits.max_prompt_tokens, model.info.context_limit - CLASS_MAX_TOKENS)
    if tokens > most:
        raise PromptRefused("tokens", tokens=tokens, most=most)
    return text


def remove_prompt(sender: str) -> None:
    """The teacher's ✕ beside a question."""
    store, mine = prompts_store(), follow_state()
    if store is not None and mine.role == "lead":
        try:
            store.remove(mine.secret, sender)
        except StoreError as failure:
            mine.prompt_message = ("class_prompt_store_down", {"error": str(failure)})


def serve_round() -> None:
    """The teacher serves the list as it stands: a new round, from its first step."""
    store, mine = prompts_store(), follow_state()
    if store is None or mine.role != "lead":
        return
    try:
        settings.serve_round = store.serve(mine.secret, settings.get("lang", "en"))
        page_session().step = 0
    except StoreError as failure:
        mine.prompt_message = ("class_prompt_store_down", {"error": str(failure)})


def serve_samples() -> None:
    settings.serve_round = 0
    page_session().step = 0
