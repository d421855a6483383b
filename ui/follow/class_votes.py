"""The class votes on the chapter's question (plain Python, no Streamlit): peer instruction's vote, reveal, discuss,
vote again.

- A **vote** is a choice's place among the question's choices as every page shows them (A = 0): the same answers map
  per browser as a prediction round's (`ui.follow.class_answers.answers_key`), so a reload or a second tab replaces
  the browser's vote.
- **Vote again** is a new round that remembers the one before: its number (`ask_first`, to read that round's map) and
  its counts (`ask_before`). Revealing it counts, over the browsers that voted both times, who went from which choice
  to which (`moves_of`), into the link (`ask_moves`), so every page draws both rounds side by side from its link.
- The **right choice** is the question's (`Question.right`, below): the lesson file's first choice of those
  that hold on the run the page shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ui.state.link import PATTERNS

LETTERS = "ABCD"  # a question's choices as shown (2 to 4)


@dataclass(frozen=True)
class Question:
    """A chapter's question as the run shown asks it (`ui.lesson.panel.question`): its text, and its choices as shown
    (A, B, …) with the right one's place among them."""

    text: str
    choices: tuple[str, ...]
    right: int


def checked_vote(choice, count: int) -> int | None:
    """The choice a student's page sends, if it is one of the `count` shown (None: no such choice)."""
    return choice if type(choice) is int and 0 <= choice < count else None


def vote_counts(counts: dict[int, int], count: int) -> tuple[int, ...]:
    """Counts per choice (A first) from counts per value, values that are no choice of `count` left out."""
    return tuple(counts.get(choice, 0) for choice in range(count))


def moves_of(before: dict[str, str], after: dict[str, str], count: int) -> dict[tuple[int, int], int]:
    """(choice before, choice after) → browsers, over the browsers whose votes in both rounds are choices of `count`
    (a browser that stayed counts under (a, a))."""
    moves: dict[tuple[int, int], int] = {}
    for browser, value in after.items():
        first = before.get(browser, "")
        if value.isdigit() and first.isdigit() and int(value) < count and int(first) < count:
            pair = (int(first), int(value))
            moves[pair] = moves.get(pair, 0) + 1
    return dict(sorted(moves.items()))


def moves_text(moves: dict[tuple[int, int], int]) -> str:
    """The moves as the link carries them: "from:to:count,…"."""
    return ",".join(f"{a}:{b}:{n}" for (a, b), n in moves.items())


def moves_from(text: str) -> dict[tuple[int, int], int] | None:
    """The moves a link carries (None: malformed)."""
    if text == "":
        return {}
    if not PATTERNS["ask_moves"].fullmatch(text):
        return None
    moves: dict[tuple[int, int], int] = {}
    for triple in text.split(","):
        a, b, n = map(int, triple.split(":"))
        moves[(a, b)] = moves.get((a, b), 0) + n
    return dict(sorted(moves.items()))


@dataclass(frozen=True)
class VoteReveal:
    right: int  # the right choice's place (A = 0)
    counts: tuple[int, ...]  # votes per choice
    before: tuple[int, ...] | None  # the round before's votes per choice, when this is a vote again
    moves: dict[tuple[int, int], int]  # (before, after) → browsers that voted both times

    @property
    def answered(self) -> int:
        return sum(self.counts)

    @property
    def changed(self) -> dict[tuple[int, int], int]:
        """The moves of browsers that changed their vote, the most taken first."""
        return dict(
            sorted(
                ((pair, n) for pair, n in self.moves.items() if pair[0] != pair[1]),
                key=lambda item: (-item[1], item[0]),
            )
        )

    @property
    def sentence(self) -> tuple[str, dict]:
        """The round in one sentence: a strings key and its values."""
        k, n = self.counts[self.right], self.answered
        if self.before is None:
            return ("vote_nobody", {}) if n == 0 else ("vote_right", {"k": k, "n": n})
        return "vote_moved", {
            "k0": self.before[self.right],
            "n0": sum(self.before),
            "k": k,
            "n": n,
            "changed": sum(self.changed.values()),
            "both": sum(self.moves.values()),
        }


def vote_reveal(
    right: int, count: int, counts: dict[int, int], before: dict[int, int] | None, moves: dict[tuple[int, int], int]
) -> VoteReveal:
    """A vote's reveal from the counts its link carries (`before`: the round before's, when this is a vote again)."""
    kept = {pair: n for pair, n in moves.items() if max(pair) < count}
    return VoteReveal(right, vote_counts(counts, count), None if before is None else vote_counts(before, count), kept)
