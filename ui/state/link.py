"""The app's shareable state: every setting a link carries, parsed and checked from the URL.

A link rebuilds exactly one state. A malformed or out-of-range value never raises: it falls back
to a sensible value and leaves a `Problem` for the page to show.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from engine.drafts import DRAFTS, MAX_GUESSES
from engine.eviction import EVICTION_POLICIES
from engine.kv_cache import DEFAULT_BLOCK_SIZE
from engine.prefix_cache import REUSE_POLICIES
from engine.sampler import TEMPERATURE_FLOOR
from viz.words import LANGUAGES as LANGS

DEFAULT_PROMPTS = {"en": "What is a KV cache?", "zh": "什么是 KV 缓存？KV 缓存是"}  # a page opens with its language's
DEFAULT_PROMPT = DEFAULT_PROMPTS["en"]
# A page in Chinese opens on the Chinese embedded model (Gemma 3 270M): a base model, without a chat template, so
# its prompt is the start of an answer for it to go on with, and the chat switch is off.
LANGUAGE_DEFAULTS = {"en": {"model": "embedded", "chat": True}, "zh": {"model": "embedded-zh", "chat": False}}
MAX_PROMPT_CHARS = 4000
# The link's view names, in the page's order (ui.views.MODULES draws each; its label is the string `view_<name>`).
VIEWS = ("flow", "attention", "kv", "split", "prefix", "costs", "eviction", "serving", "speculate")
# How many chapters a link may name: counted in the lesson's own file, not through the lesson's code (which draws
# with the views, above the link's state).
CHAPTER_COUNT = len(tomllib.loads((Path(__file__).parents[1] / "lesson" / "lesson.toml").read_text())["chapter"])


@dataclass(frozen=True)
class AppState:
    model: str = "embedded"
    prompt: str = DEFAULT_PROMPT
    chat: bool = True
    think: bool = False  # Qwen3's thinking, in a template that has the switch: off, as the articles' answers
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_splits: int = 1
    pool: str = "own"  # the KV view's pool: the run's own, or the run replayed in a pool other requests used first
    policy: str = "block"
    step: int = 0  # tokens generated; the prefill produces the first
    view: str = "flow"
    layer: int = 0
    head: int = 0
    lang: str = "en"
    large: bool = False  # projector mode: larger text
    chapter: int = 0  # the lesson's chapter, 1-based; 0: free exploration
    # The eviction view (ui/runs/eviction.py): the policy that scores positions, when it evicts (after the prefill
    # at `ratio`; during decode to `budget` every `interval` passes; StreamingLLM's sinks + latest `stream_window`)
    evict: str = "snapkv"
    evict_at: str = "prefill"
    ratio: float = 0.5
    budget: int = 32
    interval: int = 8
    stream_window: int = 28
    # The Serving view (ui/runs/serving.py): the pool's blocks and the most requests a step runs (max_num_seqs)
    serve_blocks: int = 10
    serve_seqs: int = 4
    serve_round: int = 0  # a round of the class's questions its teacher served (ui/follow/class_prompts.py); 0: none
    # The speculative view (ui/runs/speculative.py): its prompt (one that quotes itself, a free one, the page's), the
    # draft that guesses (engine.drafts.DRAFTS), the guesses a pass (k) and early exit's layers (n)
    spec_prompt: str = "edit"
    draft: str = "lookup"
    draft_k: int = 5
    draft_n: int = 6
    # A round of the class's answers, opened by the teacher at this step: its number (0: none), its kind (a prediction
    # of the next token, ui/follow/class_answers.py, or a vote on the chapter's question, ui/follow/class_votes.py),
    # whether answers are taken, closed or shown, and once shown, the class's counts per token or choice and the tokens
    # the teacher hid; a vote again names the round before, its counts and, once shown, who moved from which choice
    ask: int = 0
    ask_kind: str = "predict"
    ask_phase: str = "open"
    ask_tally: str = ""
    ask_hide: str = ""
    ask_first: int = 0
    ask_before: str = ""
    ask_moves: str = ""


@dataclass(frozen=True)
class Problem:
    """A link value that could not be used as given."""

    param: str
    value: str
    fallback: str
    reason: str  # a key into ui.text.strings (e.g. "bad_number", "out_of_range")


# (kind, low, high) for numbers; choices for enumerations.
RANGES = {
    "temperature": (float, 0.0, 5.0),
    "top_k": (int, 0, 1000),
    "top_p": (float, 0.01, 1.0),
    "seed": (int, 0, 2**31 - 1),
    "block_size": (int, 1, 256),
    "kv_splits": (int, 1, 64),
    "step": (int, 0, 100_000),
    "layer": (int, 0, 1000),
    "head": (int, 0, 1000),
    "chapter": (int, 0, CHAPTER_COUNT),
    "ratio": (float, 0.0, 0.95),  # the engine takes [0, 1): at 0.95 a 20-position context keeps one
    "budget": (int, 1, 4096),
    "interval": (int, 1, 512),
    "stream_window": (int, 1, 4096),
    "serve_blocks": (int, 1, 64),
    "serve_seqs": (int, 1, 8),
    "serve_round": (int, 0, 1_000_000),
    "draft_k": (int, 1, MAX_GUESSES),
    "draft_n": (int, 1, 1000),  # below the model's layer count (`clamp`)
    "ask": (int, 0, 1_000_000),
    "ask_first": (int, 0, 1_000_000),
}


def bounds(name: str) -> tuple:
    """A number setting's (low, high), for its widget: the same range a link value is checked against."""
    _, low, high = RANGES[name]
    return low, high


# Values above 0 but below these are raised to them; 0 itself stays (a temperature of 0 is greedy).
FLOORS = {"temperature": TEMPERATURE_FLOOR}
POOLS = ("own", "busy")
EVICT_AT = ("prefill", "decode", "stream")
SPEC_PROMPTS = ("edit", "free", "page")  # a code edit (it quotes itself), a free answer, the page's own prompt
CHOICES = {
    "view": VIEWS,
    "lang": LANGS,
    "policy": REUSE_POLICIES,
    "pool": POOLS,
    "evict": EVICTION_POLICIES,
    "evict_at": EVICT_AT,
    "spec_prompt": SPEC_PROMPTS,
    "draft": DRAFTS,
}
FLAGS = ("chat", "think", "large")
ASK_PHASES = ("open", "closed", "shown")
ASK_KINDS = ("predict", "vote")
CHOICES["ask_phase"], CHOICES["ask_kind"] = ASK_PHASES, ASK_KINDS
# Lists of numbers, in the link's own shape: "token:count,…" (at most 200 tokens), "token,…" (at most 50) and a vote's
# moves "choice:choice:count,…" (at most 4 × 4)
TALLY = re.compile(r"\d{1,7}:\d{1,5}(,\d{1,7}:\d{1,5}){0,199}")
PATTERNS = {
    "ask_tally": TALLY,
    "ask_before": TALLY,
    "ask_hide": re.compile(r"\d{1,7}(,\d{1,7}){0,49}"),
    "ask_moves": re.compile(r"\d:\d:\d{1,5}(,\d:\d:\d{1,5}){0,15}"),
}


def parse_query(params: Mapping[str, str | list[str]]) -> tuple[AppState, list[Problem]]:
    """Build the state a link describes; unknown parameters are ignored."""
    defaults = AppState()
    values: dict = {}
    problems: list[Problem] = []
    for f in fields(AppState):
        if f.name not in params:
            continue
        raw = params[f.name]
        raw = str(raw[-1] if isinstance(raw, list) else raw)
        if f.name == "prompt":
            value, reasons = clean_prompt(raw)
        else:
            value, reason = _parse_one(f.name, raw, getattr(defaults, f.name))
            reasons = (reason,) if reason else ()
        values[f.name] = value
        problems += [Problem(f.name, raw[:80], _show(value), reason) for reason in reasons]
    return replace(language_defaults(values.get("lang", defaults.lang)), **values), problems


def default_prompt(lang: str) -> str:
    """The prompt a page in `lang` opens with when its link names none."""
    return DEFAULT_PROMPTS.get(lang, DEFAULT_PROMPT)


def language_defaults(lang: str) -> AppState:
    """The state a page in `lang` opens in when its link names nothing else: that language's prompt, model and
    chat switch."""
    return replace(AppState(), lang=lang, prompt=default_prompt(lang), **LANGUAGE_DEFAULTS.get(lang, {}))


def _parse_one(name: str, raw: str, default):
    if name in RANGES:
        kind, low, high = RANGES[name]
        try:
            number = float(raw.strip()) if kind is float else int(raw.strip())
        except ValueError:
            return default, "bad_number"
        if isinstance(number, float) and not math.isfinite(number):
            return default, "bad_number"
        if not low <= number <= high:
            return min(max(number, low), high), "out_of_range"
        if 0 < number < FLOORS.get(name, 0):
            return FLOORS[name], "below_floor"
        return number, None
    if name in CHOICES:
        return (raw, None) if raw in CHOICES[name] else (default, "unknown_choice")
    if name in PATTERNS:
        return (raw, None) if raw == "" or PATTERNS[name].fullmatch(raw) else (default, "bad_list")
    if name in FLAGS:
        if raw in ("0", "1"):
            return raw == "1", None
        return default, "bad_flag"
    return raw.strip(), None  # model: checked against the allow-list when loading


# What a link's bytes that are not UTF-8 text arrive as (the query is decoded with errors="replace").
REPLACEMENT = "\ufffd"


def clean_prompt(text: str) -> tuple[str, tuple[str, ...]]:
    """Drop what is not text, then cut to MAX_PROMPT_CHARS; return the prompt and why it changed (reasons, each a
    key "reason_…" in ui.text.strings): control characters (newline and tab stay), and bytes that were not valid text
    (a link's invalid UTF-8, e.g. %ED%A0%80, arrives as U+FFFD replacement characters; a lone surrogate), which the
    model would otherwise read as "�"."""
    reasons = []
    for reason, removed in (("control_chars", _is_control), ("invalid_text", _is_not_text)):
        kept = "".join(ch for ch in text if not removed(ch))
        if kept != text:
            reasons.append(reason)
        text = kept
    if len(text) > MAX_PROMPT_CHARS:
        text = text[:MAX_PROMPT_CHARS]
        reasons.append("too_long")
    return text, tuple(reasons)


def _is_control(ch: str) -> bool:
    return ch not in "\n\t" and unicodedata.category(ch) == "Cc"


def _is_not_text(ch: str) -> bool:
    return ch == REPLACEMENT or unicodedata.category(ch) == "Cs"


def _show(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


@functools.lru_cache(maxsize=8)  # a few languages; a link may name any string
def link_defaults(lang: str) -> AppState:
    """What a link in `lang` leaves out: that language's defaults, and the default language (AppState is frozen)."""
    return replace(language_defaults(lang), lang=AppState.lang)


def link_holds(params: dict[str, str], name: str, value) -> bool:
    """Whether link parameters `params` hold `value` for setting `name`, as `to_query` writes it: a parameter left
    out holds the default (for the link's language)."""
    if name in params:
        return params[name] == _show(value)
    return value == getattr(link_defaults(params.get("lang", AppState.lang)), name)


def to_query(state: AppState) -> dict[str, str]:
    """The link parameters for `state`: only values that differ from the defaults (the prompt's, the model's and
    the chat switch's depend on the language), plus the step."""
    defaults = link_defaults(state.lang)
    out = {}
    for f in fields(AppState):
        value = getattr(state, f.name)
        if value != getattr(defaults, f.name) or f.name == "step":
            out[f.name] = _show(value)
    return out


def clamp(state: AppState, layers: int, heads: int) -> tuple[AppState, list[Problem]]:
    """Fit layer, head and early exit's layers to the loaded model (the last fitted quietly off its view)."""
    problems = []
    changes = {}
    for name, limit in (("layer", layers - 1), ("head", heads - 1), ("draft_n", max(1, layers - 1))):
        value = getattr(state, name)
        if value > limit:
            changes[name] = limit
            if name != "draft_n" or state.view == "speculate":
                problems.append(Problem(name, str(value), str(limit), "out_of_range"))
    return replace(state, **changes), problems
