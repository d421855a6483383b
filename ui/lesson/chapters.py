"""The lesson: the chapters of ui/lesson/lesson.toml, in order, each the state it puts the page in.

A chapter covers one or more teaching points (docs/teaching.md); its text (English and Chinese) quotes the
loaded model's own numbers through placeholders that `ui.lesson.chapter_facts.facts` fills.

A chapter's text may hold variants: a table under its language (`[chapter.en.all_agree]`) whose parts replace
the chapter's own where the run makes them the true ones (e.g. on a model whose three prefix-cache policies agree,
a question about why they do, not about why one reuses less). `ui.lesson.variants.variants` names the variants a
run calls for; a part comes from the first of them that has it, else from the chapter's own text.
"""

from __future__ import annotations

import itertools
import math
import tomllib
import zlib
from dataclasses import dataclass
from pathlib import Path

from ui.state.link import AppState
from ui.text import strings
from viz.words import LANGUAGES

TEXT_PARTS = ("title", "body", "look", "claim", "question", "answer")
# Settings a chapter may set besides the view and step (others keep theirs); a chapter that names none of them runs
# with the link's defaults. serve_*: the Serving view's pool (blocks) and batch limit; the speculative view's prompt,
# draft, k and n.
SETTINGS = (
    "block_size",
    "kv_splits",
    "pool",
    "serve_blocks",
    "serve_seqs",
    "spec_prompt",
    "draft",
    "draft_k",
    "draft_n",
)
DEFAULT_SETTINGS = {name: getattr(AppState(), name) for name in SETTINGS}


@dataclass(frozen=True)
class Chapter:
    number: int  # 1-based, as the link's `chapter`
    key: str
    figure: str  # the part of its view it talks about (a `ui.views.chapter_part.Part` name): first on the screen
    points: tuple[str, ...]  # teaching points, e.g. ("T4", "T11")
    view: str
    step: int
    stage: str | None  # the part of one step's picture it highlights (viz.step_picture.STAGES)
    settings: dict[str, int | str]  # the SETTINGS this chapter runs with
    case: str | None  # the article's prefix-cache case it loads ("case1", "case2")
    window_prompt: bool  # on a model with a sliding window, it runs WINDOW_PROMPTS (long enough to pass the window)
    text: dict[str, dict]  # language → part (TEXT_PARTS) → template, and variant → part → template

    def part(self, name: str, lang: str, variants: tuple[str, ...] | list[str] = ()) -> str:
        """Part `name` in `lang`: from the first of `variants` that has it, else the chapter's own."""
        text = self.text.get(lang, self.text["en"])
        for variant in variants:
            if name in text.get(variant, {}):
                return text[variant][name]
        return text[name]

    def choices(self, lang: str, variants: tuple[str, ...] | list[str] = ()) -> list[str]:
        """The question's choices in `lang` as the lesson file gives them (templates), the right one first."""
        return list(self.part("choices", lang, variants))

    def choice_order(self, count: int) -> tuple[int, ...]:
        """The order `count` choices are shown in (file indices), the same on every page, language and server: one
        permutation per chapter, so the right one (first in the file) is not always A."""
        permutations = list(itertools.permutations(range(count)))
        return permutations[zlib.crc32(self.key.encode()) % math.factorial(count)]

    @property
    def variants(self) -> tuple[str, ...]:
        """The names of the chapter's variants (the same in every language: tests/test_lesson.py)."""
        return tuple(name for name, value in self.text["en"].items() if isinstance(value, dict))


LESSON = Path(__file__).with_name("lesson.toml")


def read_chapters(path: Path = LESSON) -> tuple[Chapter, ...]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)["chapter"]
    return tuple(
        Chapter(
            number=i,
            key=c["key"],
            figure=c["figure"],
            points=tuple(c["points"]),
            view=c["view"],
            step=c["step"],
            stage=c.get("stage"),
            settings={name: c.get(name, DEFAULT_SETTINGS[name]) for name in SETTINGS},
            case=c.get("case"),
            window_prompt=c.get("window_prompt", False),
            text={lang: c[lang] for lang in LANGUAGES},
        )
        for i, c in enumerate(raw, start=1)
    )


def read_window_prompts(path: Path = LESSON) -> dict[str, str]:
    """Language → the prompt a chapter with `window_prompt` runs on a model with a sliding window."""
    with open(path, "rb") as f:
        return dict(tomllib.load(f)["window_prompt"])


CHAPTERS = read_chapters()
WINDOW_PROMPTS = read_window_prompts()


def number_of(key: str) -> int:
    """The chapter `key`'s number (1-based, as the link's `chapter`): code names chapters by key, not by place."""
    return next(c.number for c in CHAPTERS if c.key == key)


class _Missing:
    """A number this step does not have (e.g. no split before the prefill): shown as a dash, whatever its format."""

    def __format__(self, spec: str) -> str:
        return "–"


class _Count(int):
    """A count or a size: grouped by thousands ("1,024") even where a template gives no format."""

    def __format__(self, spec: str) -> str:
        return super().__format__(spec or ",")


NOT_COUNTS = frozenset({"id", "ctx_id"})  # a token id is a name, written as the vocabulary numbers it: 12345


class _Facts(dict):
    def __missing__(self, key: str) -> _Missing:
        return _Missing()


def fill(template: str, facts: dict) -> str:
    """A chapter's Markdown with this model's facts; text values show as text, as in `ui.text.strings.t`; whole numbers
    other than ids grouped by thousands."""
    shown = {
        name: _Count(value) if type(value) is int and name not in NOT_COUNTS else value
        for name, value in strings.as_text(facts).items()
    }
    return template.format_map(_Facts(shown))
