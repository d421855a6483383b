"""The class answers (plain Python, no Streamlit): before the model picks its next token, each student's page sends a
guess; the teacher reveals the class's guesses beside the model's own probabilities.

- A **guess** is read as the next word of the text so far (`spaced`) and becomes the token the model would read there:
  its first token in context, leading space included (`guess_token`). Only that token id is sent, never the text.
- **One answer per browser**: a round's answers are one map in the room's store (`answers_key`), keyed by an id kept in
  a cookie of the student's browser, so a reload or a second tab replaces the browser's answer. Answers go through the
  process's `RoomSync` (`ui.follow.sync`), which sends them again after a store's outage.
- **The round's state is the link's** (`ask`, `ask_phase`, `ask_tally`, `ask_hide`): the teacher's page opens, closes
  and reveals it, and every following page takes it as it takes the step. The revealed counts travel in the link, so a
  follower draws the reveal from its own run with no store call, and a reload draws it again. Only the leading page
  changes the link its room publishes: a student's page has no way to open, reveal or reset a round.
- **The reveal** (`reveal`): the counts per token, each with the probability the sampler gave it at that step (after
  temperature, top-k and top-p), the model's own top tokens, and the token it picked.
"""

from __future__ import annotations

import csv
import io
import re
import secrets
import unicodedata
from dataclasses import dataclass

import torch

from engine.sampler import Sampling, distribution, filter_logits
from ui.follow.class_prompts import check_text
from ui.state.link import PATTERNS

KEY_PREFIX = "kvscope:answers:"
MAX_GUESS_CHARS = 40  # a word or a few characters
MAX_SHOWN = 8  # bars in the reveal: the class's most guessed tokens and the model's top tokens, at most this many
MODEL_TOP = 5  # the model's own top tokens the reveal always shows
MAX_TIED = 3  # the class's favourites named (and drawn) on a tie; more tied than this is "no favourite"
_BROWSER_SHAPE = re.compile(r"[A-Za-z0-9_-]{16}")
OPENING = "([{<\"'“‘«‹/-"  # a guess after one of these joins it, with no space


def answers_key(code: str, round_number: int) -> str:
    return f"{KEY_PREFIX}{code}:{round_number}"


def new_browser_id() -> str:
    return secrets.token_urlsafe(12)


def is_browser_id(text) -> bool:
    return isinstance(text, str) and bool(_BROWSER_SHAPE.fullmatch(text))


def checked_guess(text: str, special_texts: list[str]) -> str:
    """The guess as typed, stripped of a trailing space, or `PromptRefused` (empty, too long, control characters, a
    model's control token, markup). A leading space is kept: it says "a new word"."""
    check_text(text, special_texts, most=MAX_GUESS_CHARS)
    return text.rstrip()


def spaced(guess: str, before: str) -> str:
    """`guess` as the next word after the text `before`: with a space before it where words are spaced (a letter or
    digit after a letter, digit or punctuation), as " Paris" after "The capital of France is"; as typed after a space,
    an opening bracket or quote, in unspaced scripts (Chinese, Japanese), or when it starts with a space or
    punctuation ("," ".")."""
    if not guess or not before or guess[0].isspace() or before[-1].isspace() or before[-1] in OPENING:
        return guess
    return " " + guess if spaced_script(guess[0]) and unicodedata.east_asian_width(before[-1]) not in "WF" else guess


def spaced_script(character: str) -> bool:
    """A letter or digit of a script that separates words with spaces."""
    return unicodedata.category(character)[0] in "LN" and unicodedata.east_asian_width(character) not in "WF"


def guess_token(tokenizer, last_id: int, before: str, guess: str) -> int:
    """The token the model would read first if the text went on with `guess` (`spaced` after `before`, the text so
    far, whose last token is `last_id`): the guess tokenized after that token, in case the two join; tokenized on
    its own where they do."""
    text = spaced(guess, before)
    ids = tokenizer.encode(tokenizer.decode([last_id]) + text, add_special_tokens=False)
    if len(ids) > 1 and ids[0] == last_id:
        return ids[1]
    return tokenizer.encode(text, add_special_tokens=False)[0]


def counts_of(answers: dict[str, str]) -> dict[int, int]:
    """A round's answers (browser → token id) as counts per token id, the most guessed first (ties: lower id)."""
    counts: dict[int, int] = {}
    for value in answers.values():
        if value.isdigit():
            counts[int(value)] = counts.get(int(value), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def tally_text(counts: dict[int, int]) -> str:
    """The counts as the link carries them: "id:count,…"."""
    return ",".join(f"{token}:{count}" for token, count in counts.items())


def tally_of(text: str) -> dict[int, int] | None:
    """The counts a link carries (None: malformed)."""
    if text == "":
        return {}
    if not PATTERNS["ask_tally"].fullmatch(text):
        return None
    counts: dict[int, int] = {}
    for pair in text.split(","):
        token, count = pair.split(":")
        counts[int(token)] = counts.get(int(token), 0) + int(count)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def ids_of(text: str) -> frozenset[int] | None:
    """The hidden token ids a link carries ("id,…"; None: malformed)."""
    if text == "":
        return frozenset()
    return frozenset(int(i) for i in text.split(",")) if PATTERNS["ask_hide"].fullmatch(text) else None


@dataclass(frozen=True)
class Bar:
    token_id: int
    count: int  # the class's guesses of this token
    probability: float  # the sampler's, at the step the class predicted
    picked: bool  # the token the model picked
    hidden: bool  # the teacher hid it: drawn without its text
    top: int | None  # its rank among the model's tokens (0: the most likely), if among MODEL_TOP


@dataclass(frozen=True)
class Reveal:
    answered: int  # how many answered
    right: int  # how many guessed the model's token
    picked: int  # the model's token
    favourites: tuple[Bar, ...]  # the class's most guessed tokens (several on a tie; none when nobody answered)
    bars: tuple[Bar, ...]  # what the figure draws, most probable first
    guesses: tuple[Bar, ...]  # every token the class guessed, the most guessed first

    @property
    def sentence(self) -> tuple[str, dict]:
        """The round in one sentence: a strings key and its values (a favourite's token as `token_label` shows it)."""
        if self.answered == 0:
            return "ask_nobody", {}
        if len(self.favourites) > MAX_TIED:
            return "ask_no_favourite", {"k": self.right, "n": self.answered, "tied": len(self.favourites)}
        return (
            "ask_favourite" if len(self.favourites) == 1 else "ask_favourites",
            {"k": self.right, "n": self.answered, "favourites": self.favourites},
        )


def reveal(
    logits: torch.Tensor, sampling: Sampling, picked: int, counts: dict[int, int], hidden: frozenset[int]
) -> Reveal:
    """The reveal of a prediction round from the step's logits (the step that picks token `picked`)."""
    probabilities = distribution(filter_logits(logits, sampling))
    top = [int(i) for i in torch.topk(probabilities, MODEL_TOP).indices if probabilities[i] > 0]  # what it may draw
    most = max(counts.values(), default=0)
    tied = [t for t, n in counts.items() if n == most and most > 0]
    shown = list(dict.fromkeys(top + [picked] + (tied if len(tied) <= MAX_TIED else [])))
    shown += [t for t in counts if t not in shown][: max(0, MAX_SHOWN - len(shown))]  # the next most guessed

    def bar(token: int) -> Bar:
        return Bar(
            token,
            counts.get(token, 0),
            float(probabilities[token]),
            token == picked,
            token in hidden,
            top.index(token) if token in top else None,
        )

    bars = tuple(sorted((bar(t) for t in shown), key=lambda b: (-b.probability, b.token_id)))
    favourites = tuple(bar(t) for t in tied)
    return Reveal(sum(counts.values()), counts.get(picked, 0), picked, favourites, bars, tuple(bar(t) for t in counts))


# answer: a token's text, a choice ("B. …") or a change of vote ("A → B"); token_id and probability: a prediction's;
# right: the model's token, or the question's right choice
EXPORT_COLUMNS = ("chapter", "round", "kind", "step", "answer", "token_id", "count", "probability", "right")


def export_csv(rows: list[dict]) -> str:
    """A lesson's revealed rounds as CSV, one row per token drawn, per choice or per change of vote
    (`EXPORT_COLUMNS`; a column a row has no value for stays empty)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
