"""The Serving view's runs: a class of requests served together from one paged pool (`engine.server.Server`), each
scheduler step recorded as it runs, stepped along with the pages and kept in the server's run store (`ui.runs.store`:
built once for pages asking at once, counted in its bytes, dropped when idle). Pages with the same requests and pool
read one `ServedClass`; going back a step reads what was recorded.

The requests: sample questions, or a class's own prompts (a round of `ui.follow.class_prompts`) topped up with samples
to a batch, each behind one shared opening (the chat template's system turn and a common instruction, or a base
model's frame), arriving over the first steps, so the later ones find the opening's blocks in the pool. Plain Python
(no Streamlit).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import engine
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidSettingError
from engine.kv_cache import DEFAULT_BLOCK_SIZE
from engine.prompt import tokenize_prompt
from engine.server import Server, StepReport
from ui.runs import turns
from ui.runs.store import RunStore

MAX_BATCHED_TOKENS = 256  # a prefill step's tokens (nano-vllm's max_num_batched_tokens), the class's prompts in all
# The pool's blocks: the page's default block size, whatever the KV view's is set to (a pool of blocks of 1 would
# need hundreds of blocks, each request thousands of positions' worth; nano-vllm's are 256 tokens)
BLOCK_SIZE = DEFAULT_BLOCK_SIZE

# The samples: one opening every request shares, then its question; each arrives at a step and answers in at most
# so many tokens. The first comes alone, so the three after it find the opening's blocks computed.
OPENING = {
    "en": "You are answering a class of students who are learning how language models work. Answer each "
    "question in one short sentence. Question: ",
    "zh": "你在回答一群正在学习大语言模型如何工作的学生。请用一句简短的话回答每个问题。问题：",
}
FRAME = {
    "en": (
        "Questions from a class learning how language models work, each answered in one short sentence.\n\nQ: ",
        "\nA:",
    ),
    "zh": ("下面是学习大语言模型的学生提的问题，每个问题用一句简短的话回答。\n\n问：", "\n答："),
}
QUESTIONS = {
    "en": (
        "What is a token?",
        "Why does a model need a KV cache?",
        "What does attention do?",
        "What is a GPU?",
        "Why is decoding slower than prefill?",
        "What is a prompt?",
    ),
    "zh": (
        "什么是 token？",
        "模型为什么需要 KV 缓存？",
        "注意力做什么？",
        "什么是 GPU？",
        "为什么解码比预填充慢？",
        "什么是提示词？",
    ),
}
ARRIVALS = (0, 1, 1, 1, 5, 9)
MAX_TOKENS = (20, 14, 24, 18, 16, 12)
CLASS_MAX_TOKENS = 16  # each of a class's prompts: its first comes alone, the others at the next step


@dataclass(frozen=True)
class ServingSetup:
    """What a served class is: its requests (prompt ids, the question shown, the step each arrives before, its token
    limit) and the server's pool and limits. Equal setups serve the same steps."""

    prompts: tuple[tuple[int, ...], ...]
    questions: tuple[str, ...]
    arrivals: tuple[int, ...]
    max_tokens: tuple[int, ...]
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int = MAX_BATCHED_TOKENS

    def fewest_blocks(self) -> int:
        """The blocks the longest request needs alone, at its last token: a smaller pool could never finish it."""
        return max(-(-(len(p) + m) // self.block_size) for p, m in zip(self.prompts, self.max_tokens))

    def check(self) -> None:
        if self.num_blocks < self.fewest_blocks():
            raise PoolTooSmall(self.fewest_blocks(), self.num_blocks)


class PoolTooSmall(InvalidSettingError):
    def __init__(self, needed: int, blocks: int):
        self.needed, self.blocks = needed, blocks
        super().__init__(f"the longest request needs {needed} blocks alone; the pool has {blocks}")


def wrapped(model: engine.Model, lang: str, chat: bool, question: str) -> list[int]:
    """A question behind the shared opening in the page's language, wrapped as the page's prompt is (the chat
    template, or not)."""
    lang = lang if lang in QUESTIONS else "en"
    if chat:
        return tokenize_prompt(model, OPENING[lang] + question, chat=True)
    before, after = FRAME[lang]
    return tokenize_prompt(model, before + question + after, chat=False)


@functools.lru_cache(maxsize=32)
def serving_setup(
    model: engine.Model, lang: str, chat: bool, num_blocks: int, max_num_seqs: int, class_texts: tuple[str, ...] = ()
) -> ServingSetup:
    """The class's prompts (the first arriving alone, the rest a step later), then sample questions: all of them
    without a class, else as many as top the class up to a batch (`max_num_seqs`). Made once for every page of the
    process: a page asks for it several times a draw, and a room's pages all ask for the same."""
    samples = QUESTIONS[lang if lang in QUESTIONS else "en"]
    if class_texts:
        count = max(0, max_num_seqs - len(class_texts))
        questions = tuple(class_texts) + samples[:count]
        arrivals = tuple(min(i, 1) for i in range(len(class_texts))) + tuple(1 for _ in range(count))
        max_tokens = (CLASS_MAX_TOKENS,) * len(class_texts) + MAX_TOKENS[:count]
    else:
        questions, arrivals, max_tokens = samples, ARRIVALS, MAX_TOKENS
    prompts = tuple(tuple(wrapped(model, lang, chat, q)) for q in questions)
    return ServingSetup(prompts, questions, arrivals, max_tokens, BLOCK_SIZE, num_blocks, max_num_seqs)


@dataclass(frozen=True)
class ServedStep:
    """One scheduler step as it ran: the server's report, its forward pass's time, the requests that arrived just
    before it, and each request's answer text after it."""

    report: StepReport
    seconds: float
    arrived: tuple[int, ...]
    texts: tuple[str, ...]


class ServedClass:
    """The setup's requests served step by step, every step recorded (`steps[i]` is step i + 1)."""

    def __init__(self, model: engine.Model, setup: ServingSetup):
        setup.check()
        self.model, self.setup = model, setup
        self.server = Server(
            model, setup.num_blocks, setup.block_size, setup.max_num_seqs, setup.max_num_batched_tokens
        )
        self.steps: list[ServedStep] = []
        self._texts = [""] * len(setup.prompts)
        self._detokenizers: list[IncrementalDetokenizer] = []
        self.lock = turns.TurnLock()  # one page steps the class at a time; others read the steps it has

    @property
    def finished(self) -> bool:
        """Every request arrived and finished."""
        return len(self._detokenizers) == len(self.setup.prompts) and self.server.finished

    def advance_to(self, count: int) -> int:
        """Serve until `count` steps are recorded (or every request finished); return the step reached (`count`, or
        the last). The page's turn is shared between two steps (`turns.share`)."""
        while True:
            with self.lock:
                if len(self.steps) >= count or self.finished:
                    return min(count, len(self.steps))
                self._step()
            turns.share()

    def _step(self) -> None:
        arrived = self._arrive()
        start = time.perf_counter()
        report = self.server.step()
        seconds = time.perf_counter() - start
        for rid, token in report.produced.items():
            done = report.requests[rid].status == "finished"
            self._texts[rid] += self._detokenizers[rid].add(token, final=done)
        self.steps.append(ServedStep(report, seconds, arrived, tuple(self._texts)))

    def _arrive(self) -> tuple[int, ...]:
        """Add the requests due before this step; when none runs or waits, the next ones come now."""
        setup, done = self.setup, len(self.steps)
        due = [i for i in range(len(self._detokenizers), len(setup.prompts)) if setup.arrivals[i] <= done]
        if not due and self.server.finished:
            nxt = setup.arrivals[len(self._detokenizers)]
            due = [i for i in range(len(self._detokenizers), len(setup.prompts)) if setup.arrivals[i] == nxt]
        for i in due:
            self.server.add(list(setup.prompts[i]), setup.max_tokens[i])
            self._detokenizers.append(IncrementalDetokenizer(self.model.tokenizer, setup.prompts[i]))
        return tuple(due)

    @property
    def nbytes(self) -> int:
        """The pool's K/V (the server holds it whole) and the steps' records."""
        pool = self.server.pool
        return pool.num_blocks * pool.block_size * pool.bytes_per_token + 2_000 * len(self.steps)


def served_for(store: RunStore, model: engine.Model, setup: ServingSetup) -> ServedClass:
    """The served class of `setup` from `store` (built once); raises `PoolTooSmall` before anything is held."""
    setup.check()
    return store.get(("serving", id(model), setup), lambda: ServedClass(model, setup))
