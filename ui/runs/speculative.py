"""The speculative view's runs: one prompt decoded by `engine.speculative`, one verify pass a step, every pass recorded
as it runs, stepped along with the pages and kept in the server's run store (built once for pages asking at once,
dropped when idle). Pages with the same prompt, draft and sampling read one `SpeculativeRun`; going back a pass reads
what was recorded. Its measurement (`Measured`): the same answer decoded plainly and by each draft, timed on this
machine, made once on request, kept on the run. Plain Python (no Streamlit).

The prompts: one that quotes itself (a code edit: the answer restates the code with one name changed, so prompt
lookup finds most of it) and one that does not (a free answer), each for a chat model and for a base model to
continue, in the page's language; or the page's own prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import engine
from engine.drafts import make_draft
from engine.prompt import tokenize_prompt
from engine.sampler import Sampling
from engine.speculative import SpeculativeGeneration, VerifyPass
from ui.runs import turns
from ui.runs.store import RunStore

MAX_TOKENS = 48  # the answer's length: enough passes to see where guessing pays
_CODE = "def total(items):\n    x = 0\n    for item in items:\n        x += item.price * item.count\n    return x\n"
PROMPTS = {
    ("edit", "en", True): "Rename the variable x to total_price in this function. Reply with the whole function "
    f"only.\n\n```python\n{_CODE}```",
    ("edit", "en", False): f"Before:\n```python\n{_CODE}```\nAfter renaming x to total_price:\n```python\n",
    ("edit", "zh", True): f"把这个函数里的变量 x 改名为 total_price，只回复整个函数。\n\n```python\n{_CODE}```",
    ("edit", "zh", False): f"改名之前：\n```python\n{_CODE}```\n把 x 改名为 total_price 之后：\n```python\n",
    ("free", "en", True): "Write a short story about a robot who learns to paint.",
    ("free", "en", False): "Once upon a time, a little robot who wanted to paint",
    ("free", "zh", True): "写一个关于学画画的小机器人的短故事。",
    ("free", "zh", False): "从前，有一个想学画画的小机器人，",
}
MEASURED_TOKENS = 24  # the answer each draft decodes when timed: early exit's drafts make it the longest


@dataclass(frozen=True)
class SpeculativeSetup:
    """What a speculative run is: the prompt's ids and the draft with its settings. Equal setups run the same passes."""

    prompt_ids: tuple[int, ...]
    draft: str
    k: int
    layers: int
    sampling: Sampling


def prompt_text(which: str, lang: str, chat: bool, page_prompt: str) -> str:
    """The view's prompt `which` (SPEC_PROMPTS) in the page's language, for a chat model or a base model."""
    if which == "page":
        return page_prompt
    return PROMPTS[(which, lang if lang == "zh" else "en", chat)]


def setup_for(model: engine.Model, state, chat: bool, page_prompt: str, sampling: Sampling) -> SpeculativeSetup:
    """The setup of the link's settings (`state`: the page's `AppState`: its prompt choice, language, draft, k and n)
    for a run with `chat` and `sampling`; raises InvalidSettingError (a bad draft setting) before anything runs."""
    make_draft(state.draft, state.draft_k, state.draft_n, model)
    ids = tokenize_prompt(model, prompt_text(state.spec_prompt, state.lang, chat, page_prompt), chat)
    return SpeculativeSetup(tuple(ids), state.draft, state.draft_k, state.draft_n, sampling)


class SpeculativeRun:
    """The setup's passes run one at a time, each recorded (`passes[i]` is pass i + 1 of the page)."""

    def __init__(self, model: engine.Model, setup: SpeculativeSetup):
        self.model, self.setup = model, setup
        self.generation = generation_of(model, setup, setup.draft)
        self.lock = turns.TurnLock()  # one page runs a pass at a time; others read the passes it has
        self.measured: Measured | None = None  # plain decoding against each draft, once a page asked (`measure`)
        self._measuring = turns.TurnLock()

    @property
    def passes(self) -> list[VerifyPass]:
        return self.generation.passes

    @property
    def finished(self) -> bool:
        return self.generation.finished

    def advance_to(self, count: int) -> int:
        """Run passes until `count` are recorded (or the answer ended); return the passes there are up to `count`."""
        while True:
            with self.lock:
                if len(self.passes) >= count or self.finished:
                    return min(count, len(self.passes))
                self.generation.step()
            turns.share()

    def measure(self) -> Measured:
        """The setup's answer decoded plainly and by each draft, timed here (long: the page says it is measuring);
        made once, for every page reading this run."""
        with self._measuring:
            if self.measured is None:
                self.measured = measure(self.model, self.setup)
            return self.measured

    def answer_after(self, count: int) -> tuple[list[int], str]:
        """The answer's ids and text after the first `count` passes."""
        done = self.passes[:count]
        return [t for p in done for t in p.added], "".join(p.text for p in done)

    @property
    def nbytes(self) -> int:
        """The pool's K/V (held whole for the run) and the passes' records."""
        pool = self.generation.table.pool
        return pool.num_blocks * pool.block_size * pool.bytes_per_token + 1_000 * len(self.passes)


def generation_of(
    model: engine.Model, setup: SpeculativeSetup, draft: str, tokens: int = MAX_TOKENS
) -> SpeculativeGeneration:
    return SpeculativeGeneration(
        model,
        list(setup.prompt_ids),
        make_draft(draft, setup.k, setup.layers, model),
        sampling=setup.sampling,
        max_new_tokens=tokens,
    )


@dataclass(frozen=True)
class Timed:
    """One draft's answer of `MEASURED_TOKENS`: its passes, tokens and milliseconds per token (its passes' time)."""

    draft: str
    passes: int
    tokens: int
    ms_per_token: float
    same_tokens: bool  # the answer equals plain decoding's (greedy: it must)


@dataclass(frozen=True)
class Measured:
    """Plain decoding against each draft, on this machine, for one setup (its k and n)."""

    rows: tuple[Timed, ...]

    def of(self, draft: str) -> Timed:
        return next(r for r in self.rows if r.draft == draft)


def measure(model: engine.Model, setup: SpeculativeSetup) -> Measured:
    """Plain decoding, prompt lookup and early exit each decode the setup's first `MEASURED_TOKENS` tokens, the passes
    interleaved (a busy moment slows all three alike) and only the passes timed: between two, the page gives way to
    others (`turns.share`). Long (early exit's drafts the most): the page says it is measuring."""
    drafts = ("none", "lookup", "early_exit")
    generations = {d: generation_of(model, setup, d, MEASURED_TOKENS) for d in drafts}
    seconds = dict.fromkeys(drafts, 0.0)
    try:
        while not all(s.finished for s in generations.values()):
            for draft, generation in generations.items():
                if not generation.finished:
                    start = time.perf_counter()
                    generation.step()
                    seconds[draft] += time.perf_counter() - start
                    turns.share()
        plain = generations["none"].generated
        return Measured(
            tuple(
                Timed(d, len(s.passes), len(s.generated), 1000 * seconds[d] / len(s.generated), s.generated == plain)
                for d, s in generations.items()
            )
        )
    finally:
        for generation in generations.values():
            generation.close()


def run_for(store: RunStore, model: engine.Model, setup: SpeculativeSetup) -> SpeculativeRun:
    run = store.get(("speculative", id(model), setup), lambda: SpeculativeRun(model, setup))
    store.trim()
    return run
