"""The class's own prompts for the Serving view (plain Python, no Streamlit): in a follow room, each student's page may
send one prompt; the teacher's page lists them, may remove any, and serves a round: the list as it stands then,
frozen, which every page of the room reads by its number (`serve_round` in the link) and serves alike.

One record per room in the room's store (`ui.follow.store`), under the room's code, changed by one atomic update at a
time: the prompts in the order they came (each with its sender, a random id of the student's page that is never
shown), and the last few rounds. A prompt is text the student was told the class would see; `check_text` refuses what
is not plain text before anything is stored.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

from ui.follow.rooms import code_for
from ui.follow.store import Store

KEY_PREFIX = "kvscope:prompts:"
TTL_SECONDS = 4 * 3600.0  # a lesson's length: a room's prompts outlive a teacher's reload, not the day
MAX_CHARS = 200  # a prompt the projector's table shows on a line or two
MAX_PROMPTS = 40  # a class's list: a room of 30 and some to spare
ROUNDS_KEPT = 3  # the rounds pages may still be on (the newest, and the two before it)
MARKUP = re.compile(r"<[A-Za-z/!?][^<>]*>")  # an HTML or XML tag


@dataclass(frozen=True)
class ClassPrompt:
    sender: str
    text: str


@dataclass(frozen=True)
class ServedRound:
    lang: str  # the class's language: the opening every page wraps the questions in
    prompts: tuple[ClassPrompt, ...]

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(p.text for p in self.prompts)


class PromptRefused(Exception):
    """Why a prompt was not taken: `reason` is a key's end ("empty", "too_long", …; the page says
    `class_prompt_<reason>` in its language), `values` what that message quotes."""

    def __init__(self, reason: str, **values):
        self.reason, self.values = reason, values
        super().__init__(reason)


def check_text(text: str, special_texts: list[str], most: int = MAX_CHARS) -> str:
    """The prompt to send, stripped, or PromptRefused: empty, longer than `most` characters, with control characters,
    with a model's control token (`special_texts`: "<|im_start|>", "<bos>", …), or with markup."""
    text = text.strip()
    if not text:
        raise PromptRefused("empty")
    if len(text) > most:
        raise PromptRefused("too_long", most=most, length=len(text))
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in text):
        raise PromptRefused("control_chars")
    found = next((special for special in special_texts if special and special in text), None)
    if found is not None:
        raise PromptRefused("control_token", token=found)
    if MARKUP.search(text):
        raise PromptRefused("markup")
    return text


class ClassPrompts:
    """The class's prompts of the rooms in `store`."""

    def __init__(self, store: Store):
        self.store = store

    def send(self, code: str, sender: str, text: str) -> int:
        """Add `sender`'s prompt (already `check_text`ed) to room `code`'s list; its place in the list (1-based). Raises
        PromptRefused: "second" (this sender has one in the list), "full" (MAX_PROMPTS)."""
        placed: list[int] = []

        def change(raw: str | None) -> str | None:
            placed.clear()  # the store may call this again after a concurrent write
            record = parse(raw)
            if any(p["sender"] == sender for p in record["prompts"]):
                raise PromptRefused("second")
            if len(record["prompts"]) >= MAX_PROMPTS:
                raise PromptRefused("full", most=MAX_PROMPTS)
            record["prompts"].append({"sender": sender, "text": text})
            placed.append(len(record["prompts"]))
            return json.dumps(record)

        self.store.update(KEY_PREFIX + code, change, TTL_SECONDS)
        return placed[0]

    def prompts(self, code: str) -> list[ClassPrompt]:
        """Room `code`'s list, in the order they came."""
        return [ClassPrompt(**p) for p in parse(self.store.get(KEY_PREFIX + code))["prompts"]]

    def remove(self, secret: str, sender: str) -> None:
        """The teacher (who holds the room's `secret`) takes `sender`'s prompt off the list (rounds served keep it)."""

        def change(raw: str | None) -> str | None:
            record = parse(raw)
            record["prompts"] = [p for p in record["prompts"] if p["sender"] != sender]
            return json.dumps(record)

        self.store.update(KEY_PREFIX + code_for(secret), change, TTL_SECONDS)

    def serve(self, secret: str, lang: str) -> int:
        """The teacher freezes the list as a new round, served in the class's language `lang` (every page of the room
        wraps the questions alike, whatever its own language); its number (≥ 1). Only the latest ROUNDS_KEPT are
        kept."""
        served: list[int] = []

        def change(raw: str | None) -> str | None:
            served.clear()
            record = parse(raw)
            number = max((int(n) for n in record["rounds"]), default=0) + 1
            record["rounds"][str(number)] = {"lang": lang, "prompts": list(record["prompts"])}
            for old in sorted(record["rounds"], key=int)[:-ROUNDS_KEPT]:
                del record["rounds"][old]
            served.append(number)
            return json.dumps(record)

        self.store.update(KEY_PREFIX + code_for(secret), change, TTL_SECONDS)
        return served[0]

    def round(self, code: str, number: int) -> ServedRound | None:
        """Round `number` of room `code` as it was served; None where the store no longer holds it."""
        served = parse(self.store.get(KEY_PREFIX + code))["rounds"].get(str(number))
        if served is None:
            return None
        return ServedRound(served["lang"], tuple(ClassPrompt(**p) for p in served["prompts"]))


def parse(raw: str | None) -> dict:
    """A room's record; an empty one where there is none (or it is not one this module wrote)."""
    try:
        record = json.loads(raw) if raw is not None else {}

        def prompts(items) -> list[dict[str, str]]:
            return [{"sender": str(p["sender"]), "text": str(p["text"])} for p in items]

        rounds = {
            str(int(n)): {"lang": str(served["lang"]), "prompts": prompts(served["prompts"])}
            for n, served in record.get("rounds", {}).items()
        }
        return {"prompts": prompts(record.get("prompts", [])), "rounds": rounds}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"prompts": [], "rounds": {}}
