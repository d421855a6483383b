"""The lesson: every chapter opens from its link in both languages and on both embedded models, puts the page in
the state it claims, quotes the model's own numbers (computed here from model.info and an engine run of our own,
not from the chapter's text), and asks only questions whose premise holds on that run; a real browser moves
through the chapters with PageDown / PageUp, the buttons and the list, and leaves the lesson keeping the page as
it is."""

import math
import re
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

import engine
from engine.prompt import has_chat_template
from engine.tokens import token_cells
from tests.app_helpers import VIEW_TITLES, assert_clean, open_whole_view, start
from tests.helpers import WAIT_MS, Received, hf_keys_before_rotation, press
from tests.runs import decode
from tests.server import browser_page, settled_text
from tests.test_app import english_left
from tests.test_eviction_view import eviction_numbers, strong_sink
from tests.test_gemma_views import charts, matrix
from tests.test_serving_view import serving_numbers
from tests.test_speculative_view import free_guesses_worse, plain_answer_equal, speculative_numbers
from ui.follow.class_votes import LETTERS
from ui.lesson.chapters import CHAPTERS, WINDOW_PROMPTS, fill, number_of
from ui.state.link import default_prompt, language_defaults, parse_query
from ui.text import strings
from ui.views.cases import CASE_BLOCK_SIZE, CASE_CACHED, CASES
from viz.style import fmt_size
from viz.tokens import position_label


def lesson_text(at) -> str:
    """The lesson's header (the chapter's title) and its panel, where the chapter's text and numbers are."""
    panel = at.container("chapter")
    return "\n".join([t.value for t in at.title] + [m.value for m in panel.markdown] + [c.value for c in panel.caption])


@cache
def own_trace(model: engine.Model, prompt: str, step: int, block_size: int, kv_splits: int, chat: bool = True):
    """The trace of `step` on the page's default run, from a generation of our own."""
    generation, traces = decode(model, prompt, step - 1, chat=chat, block_size=block_size, kv_splits=kv_splits)
    return generation, traces[step - 1]


def case_reuse(model: engine.Model, case: str) -> dict:
    """What real prefix caches reuse of the article's case after its cached prompt ran, per policy."""
    out = {}
    for policy in engine.REUSE_POLICIES:
        cache_ = engine.PrefixCache(model, policy=policy, block_size=CASE_BLOCK_SIZE)
        for prompt in (CASE_CACHED, CASES[case]):
            generation = engine.Generation(model, prompt, prefix_cache=cache_, max_new_tokens=1)
            out[policy] = generation.prefill().prefix.reused_tokens
            generation.close()
    return out


# The pages a class opens: Chinese on Gemma 3 270M (its default), English on SmolLM2 (its default) and on Gemma 3.
PAGES = [("embedded", "en"), ("embedded-zh", "zh"), ("embedded-zh", "en")]
FIXTURES = {"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}


def page_link(model_name: str, lang: str) -> dict:
    """The link of a page in `lang` on `model_name` (the model named only where it is not the language's own)."""
    return {"lang": lang} | ({} if language_defaults(lang).model == model_name else {"model": model_name})


def page_chat(model: engine.Model, lang: str) -> bool:
    """The chat switch such a page runs with: the language's default, off on a model without a template."""
    return language_defaults(lang).chat and has_chat_template(model.tokenizer)


def plain(markdown: str) -> str:
    r"""Markdown's escapes undone (a token "<bos>" is written "\<bos\>"): the text a reader sees."""
    return re.sub(r"\\(.)", r"\1", markdown)


@dataclass
class Run:
    """What the chapter's run is, computed here from the engine: the numbers its text must quote and the facts
    its questions' premises are checked against."""

    model: engine.Model
    n: int  # prompt tokens
    context: int  # positions the chapter's step reads
    trace: object | None  # the chapter's step (None for a case: its prefill runs on a prefix cache)
    ids: list[int]  # the sequence the chapter's step reads
    shown: list[int] | None = None  # the tokens on the page: the prompt and the step's tokens
    reuse: dict | None = None  # a case: tokens each policy reuses
    cached: list[int] | None = None  # a case: the cached prompt's ids

    @property
    def info(self):
        return self.model.info

    @property
    def window(self) -> int | None:
        return next((w for w in self.info.layer_windows if w is not None), None)

    def kv_at(self, length: int) -> int:
        """Every layer's K/V at `length` positions: a sliding-window layer keeps at most its window."""
        info = self.info
        element = self.model.weights.embed_tokens.element_size()
        windows = info.layer_windows or (None,) * info.layers
        return (
            2 * info.kv_heads * info.head_dim * element * sum(length if w is None else min(length, w) for w in windows)
        )

    def scores(self, length: int) -> int:
        """Attention scores a prefill of `length` computes: each query against the keys its layer reads, counted."""
        windows = self.info.layer_windows or (None,) * self.info.layers
        per_window = {w: sum(min(i, w or i) for i in range(1, length + 1)) for w in set(windows)}
        return self.info.q_heads * sum(per_window[w] for w in windows)

    @property
    def keep(self) -> int:  # the truncation slider's first position: the last half of the prompt
        return max(1, self.n // 2)


def run_of(chapter, model: engine.Model, lang: str, prompt: str | None = None) -> Run:
    if chapter.case:
        tokenizer = model.tokenizer
        cached, new = tokenizer.encode(CASE_CACHED), tokenizer.encode(CASES[chapter.case])
        return Run(model, len(new), len(new), None, new, reuse=case_reuse(model, chapter.case), cached=cached)
    generation, trace = own_trace(
        model,
        prompt or chapter_prompt(chapter, model, lang),
        chapter.step,
        chapter.settings["block_size"],
        chapter.settings["kv_splits"],
        page_chat(model, lang),
    )
    n, context = len(generation.prompt_ids), trace.context_length
    return Run(
        model,
        n,
        context,
        trace,
        generation.prompt_ids + generation.generated[: context - n],
        shown=generation.prompt_ids + generation.generated[: chapter.step],
    )


def chapter_prompt(chapter, model: engine.Model, lang: str) -> str:
    """The prompt a chapter runs: the sliding-window chapter's own on a model with a window, else the language's."""
    windowed = any(w is not None for w in model.info.layer_windows)
    return WINDOW_PROMPTS[lang] if chapter.window_prompt and windowed else default_prompt(lang)


def expected_numbers(chapter, run: Run, at) -> list[str]:
    """The numbers this chapter must quote, as the page formats them."""
    info, trace, n, context, kv_at = run.info, run.trace, run.n, run.context, run.kv_at
    element = run.model.weights.embed_tokens.element_size()
    kv = 2 * info.layers * info.kv_heads * info.head_dim * element
    window = run.window
    past = [f"{window:,}"] if window and context > window else []  # the clause that says a window has slid
    if chapter.case:
        first = next(i for i, (a, b) in enumerate(zip(run.cached + [-1], run.ids + [-2])) if a != b)
        reuse = run.reuse
        labels = [position_label(c) for c in token_cells(run.model.tokenizer, run.cached, [])]  # the table's
        numbers = [reuse["whole"], reuse["block"], reuse["radix"]]
        if chapter.case == "case2":  # the tokens both prompts begin with, and what this run's policy reused
            return [str(x) for x in numbers + [first, " · ".join(labels[:first])]]
        return [str(x) for x in numbers + [len(run.cached), len(run.ids), " · ".join(labels)]]
    layer = int(at.session_state["w_layer"]) if "w_layer" in at.session_state else 0

    numbers = {
        "tokens": lambda: [f"{info.vocab:,}", info.hidden, n],
        "prefill": lambda: [n, info.layers, f"{kv:,}", f"id {trace.token_id}", f"{kv_at(context) / 1024:,.1f}", *past],
        "decode": lambda: [info.layers, f"{info.hidden} × {info.vocab:,}", trace.token_id, trace.positions[-1]],
        "two_paths": lambda: (
            [trace.token_id, info.hidden]
            + (  # Gemma scales its embeddings by √hidden
                [f"√{info.hidden} ≈ {math.sqrt(info.hidden):.1f}"] if info.family == "gemma3_text" else []
            )
        ),
        "residual": lambda: [info.layers, 2 * info.layers] + ([len(info.layer_norms)] if post_norms(run) else []),
        "attention": lambda: [f"q·k_j/√{round(1 / run.model.attention_scales[layer] ** 2):,}", f"{context:,}"],
        "gqa": lambda: [
            f"{info.q_heads} × {info.head_dim} = {info.q_heads * info.head_dim:,}",
            f"{2 * info.layers * info.q_heads * info.head_dim * element:,}",
            info.kv_heads,
        ],
        "kv_cache": lambda: [
            f"2 × {info.layers} × {info.kv_heads} × {info.head_dim} × {element} = {kv:,}",
            f"{kv_at(context) / 1024:,.1f}",
            *past,
        ],
        "paging": lambda: [len(trace.block_table), context, "0 → ", math.ceil(n / chapter.settings["block_size"])],
        "long_context": lambda: (
            [f"{kv_at(context) / 2**20:,.2f}", context, info.layers, *past, *crossovers(info, context, kv_at)]
            + ([] if kv_at(2 * context) == 2 * kv_at(context) else [f"{kv_at(2 * context) / 2**20:,.2f}"])
        ),
        "split_kv": lambda: [len(trace.split.ranges), f"{trace.split.max_abs_diff.max().item():.1e}"],
        "context_window": lambda: growth_numbers(run),
        "sliding_window": lambda: window_numbers(run, chapter.settings["block_size"], at.session_state["w_lang"]),
        "evicting": lambda: eviction_numbers(run.model, run.shown[: run.n], chapter.step),
        "serving": lambda: serving_numbers(
            run.model, at.session_state["w_lang"], at.session_state["w_chat"], chapter.step
        ),
        "speculative": lambda: speculative_numbers(
            run.model, at.session_state["w_lang"], at.session_state["w_chat"], chapter.step
        ),
        "contexts": lambda: contexts_numbers(run.model, at.session_state["w_model"], at.session_state["w_lang"])[0],
    }[chapter.key]()
    return [str(x) for x in numbers]


def contexts_numbers(model: engine.Model, spec: str, lang: str) -> tuple[list[str], dict[str, list[float]]]:
    """The fixed-weights chapter, computed with transformers on the same weights: the token's id and its two
    positions, the last layer's number, and per layer the cosines between its two contexts of the keys before RoPE
    (k_proj's output, after k_norm where the model has one, from forward hooks), of the keys as cached, and of the
    values as cached."""
    from transformers import AutoModelForCausalLM

    from engine.loader import resolve_source
    from engine.prompt import tokenize_prompt

    first, second, word = (str(strings.t(key, lang)) for key in ("contexts_first", "contexts_second", "contexts_word"))
    ends = []
    for sentence in (first, second):
        ids = tokenize_prompt(model, sentence, chat=False)
        head = tokenize_prompt(model, sentence[: sentence.index(word) + len(word)], chat=False)
        assert ids[: len(head)] == head
        ends.append((ids[: len(head)], len(head) - 1))
    hf = AutoModelForCausalLM.from_pretrained(resolve_source(spec), dtype=model.dtype).eval()
    per_context = []
    for ids, index in ends:
        cache, unrotated = hf_keys_before_rotation(hf, ids)
        before = [token_row(keys, len(ids), index) for keys in unrotated]
        per_context.append(
            dict(
                unrotated=before,
                keys=[layer.keys[0, :, -1].float().flatten() for layer in cache.layers],
                values=[layer.values[0, :, -1].float().flatten() for layer in cache.layers],
            )
        )
    a, b = per_context
    cos = {
        name: [
            torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=0).item()
            for x, y in zip(a[name], b[name])
        ]
        for name in a
    }
    id_ = ends[0][0][ends[0][1]]
    position, layer = ("position {}", "layer {}") if lang == "en" else ("位置 {}", "第 {} 层")
    return [str(id_), position.format(ends[0][1]), position.format(ends[1][1]), layer.format(len(cos["keys"]) - 1)], cos


def token_row(keys: torch.Tensor, n: int, index: int) -> torch.Tensor:
    """Position `index` of one sequence's keys, laid flat: (n, kv_heads × D), (n, kv_heads, D), or (kv_heads, n, D)
    where a model normalises them after moving the heads first (Gemma 3 in transformers)."""
    by_position = keys.transpose(0, 1) if keys.dim() == 3 and keys.shape[1] == n and keys.shape[0] != n else keys
    return by_position[index].float().flatten()


def post_norms(run: Run) -> bool:
    """Whether each branch's output is normalised before its add (Gemma 3), from the weights themselves."""
    return run.model.weights.layers[0].attention_output_norm is not None


def growth_numbers(run: Run) -> list[str]:
    """Chapter 14: its growth chart's numbers, computed here (tests/test_lesson.py checks the chart's data equal
    them): K/V and attention scores at the limit, and with a sliding window where and how the K/V bends; and what
    keeping the last half of the prompt keeps (the truncation slider's first position)."""
    info, kv_at, limit, window = run.info, run.kv_at, run.info.context_limit, run.window
    out = [
        f"{limit:,}",
        f"{info.kv_bytes_per_token:,}",
        f"{kv_at(limit) / 2**20:,.1f}",
        f"{run.scores(limit) / 1e6:,.0f}",
    ]
    if window:
        out += [
            f"{window:,}",
            f"{kv_at(window) / 2**20:,.1f}",
            f"{kv_at(window + 1) - kv_at(window):,}",
            f"{limit * info.kv_bytes_per_token / 2**20:,.1f}",
            f"{info.layers * info.q_heads * limit * (limit + 1) / 2 / 1e6:,.0f}",
        ]
    if run.n >= 2:
        n, keep = run.n, run.keep
        out += [
            f"{kv_at(keep) / 1024:,.1f}",
            f"{kv_at(n) / 1024:,.1f}",
            f"{100 * kv_at(keep) / kv_at(n):.0f}%",
            f"{100 * run.scores(keep) / run.scores(n):.0f}%",
        ]
    return out


# How the window chapter writes them.
WINDOW_WORDS = {
    "en": ("{} to {}", "{} blocks of {}", "**{} blocks**", "in {} blocks."),
    "zh": ("{} 至 {}", "{} 个块，每块 {} 个", "**{} 个块**", "共 {} 个块。"),
}


def window_numbers(run: Run, size: int, lang: str) -> list[str]:
    """The sliding-window chapter, worked out here from the run's length and the model's layers: where the newest
    query's window starts, the positions and blocks the local layers hold and handed back (a block goes back once
    every position in it is before length − window + 1), what the global layers keep, and the bytes of each."""
    info, context = run.info, run.context
    span, in_blocks, returned, global_blocks = WINDOW_WORDS[lang]
    position, blocks, window = context - 1, -(-context // size), run.window
    per_layer = 2 * info.kv_heads * info.head_dim * run.model.weights.embed_tokens.element_size()
    every = f"{context * info.layers * per_layer / 1024:,.1f}"
    if window is None:
        limit = info.context_limit
        return [
            f"{context:,}",
            in_blocks.format(blocks, size),
            every,
            f"{info.layers * per_layer:,}",
            f"{limit:,}",
            fmt_size(limit * info.layers * per_layer),
            str(info.layers),
        ]
    local = sum(w is not None for w in info.layer_windows)
    start = max(0, context - window + 1) // size * size  # the first position the local layers still hold
    reads = max(0, position - window + 1)
    global_layers = ", ".join(str(i) for i, w in enumerate(info.layer_windows) if w is None)
    if not start:
        return [f"{context:,}", in_blocks.format(blocks, size), every, f"{reads:,}", global_layers]
    return [
        f"{context:,}",
        span.format(f"{reads:,}", f"{position:,}"),
        span.format(f"{start:,}", f"{position:,}"),
        f"{context - start:,}",
        in_blocks.format(blocks - start // size, size),
        returned.format(start // size),
        span.format(0, f"{start - 1:,}"),
        f"{start * local * per_layer / 1024:,.1f}",
        global_blocks.format(blocks),
        global_layers,
        f"{(context - start) * local * per_layer / 1024:,.1f}",
        f"{context * (info.layers - local) * per_layer / 1024:,.1f}",
        every,
    ]


def crossovers(info, context: int, kv_at) -> list[str]:
    """Chapter 10: where one step's K/V passes its weights (the embedded model's are tied: all are read), by brute
    force: the batch at this context and at the limit, the context of one request; Qwen3-0.6B's from its card
    (596,049,920 parameters in bfloat16, 114,688 B of K/V per position)."""

    def first(passes):
        return f"{next(x for x in range(1, 10**6) if passes(x)):,}"

    weights, qwen, qwen_kv = info.parameters * info.element_bytes, 596_049_920 * 2, 114_688
    return [
        first(lambda b: b * kv_at(context) > weights),
        first(lambda b: b * kv_at(info.context_limit) > weights),
        first(lambda n: kv_at(n) > weights),
        first(lambda n: n * qwen_kv > qwen),
        first(lambda b: b * context * qwen_kv > qwen),
        f"{weights / 2**20:,.0f}",
    ]


def causal(run: Run, at) -> bool:
    """The attention chapter's heatmap, recomputed by the engine for the shown layer: every query's weights on
    later positions are zero (the top-right triangle is empty)."""
    import torch

    layer = int(at.session_state["w_layer"])
    probs, _ = run.model.full_attention(run.ids, layer)
    return bool((torch.triu(probs.float(), diagonal=1) == 0).all())


def premises(chapter, run: Run, at) -> dict[tuple[str, str | None], bool]:
    """(part, variant) → whether the premise of that text of the chapter (None: its own, else a variant's) holds on
    the run. A text not listed states nothing that depends on the run (a question about a hypothetical, a fact of
    every model)."""
    info, n, context, window, kv_at = run.info, run.n, run.context, run.window, run.kv_at
    if chapter.key == "evicting":  # its question asks why a layer looks so much at position 0
        strong = strong_sink(run.model, run.shown[: run.n], chapter.step)
        return {(part, None): strong for part in ("question", "answer", "choices")} | {
            (part, "weak_sink"): not strong for part in ("question", "answer", "choices")
        }
    if chapter.key == "contexts":  # layer 0 reads the embedding alone only where the position enters by RoPE
        rope = info.positions.startswith("RoPE")
        return {(part, None): rope for part in ("body", "look", "claim")} | {
            (part, "learned"): not rope for part in ("body", "look", "claim")
        }
    if chapter.key == "prefill":
        return {(part, None): n >= 2 for part in ("question", "answer", "choices")} | {
            (part, "one_token"): n == 1 for part in ("question", "answer", "choices")
        }
    if chapter.key == "residual":
        return {("body", None): not post_norms(run), ("body", "post_norms"): post_norms(run)}
    if chapter.key == "attention":
        return {("question", None): causal(run, at), ("answer", None): causal(run, at)}
    if chapter.key == "gqa":
        return {(part, None): info.q_heads > info.kv_heads for part in ("question", "answer", "choices")} | {
            (part, "mha"): info.q_heads == info.kv_heads for part in ("question", "answer", "choices")
        }
    if chapter.key == "long_context":
        doubles = kv_at(2 * context) == 2 * kv_at(context)
        grows_less = kv_at(context) < kv_at(2 * context) < 2 * kv_at(context)
        return {
            ("answer", None): doubles,
            ("answer", "window_doubling"): not doubles,
            ("choices", None): doubles,
            ("choices", "window_doubling"): grows_less,
        }
    if chapter.key == "prefix_case1":
        reuse, cached = run.reuse, len(run.cached)
        fewer = reuse["block"] < reuse["radix"]
        agree = reuse["whole"] == reuse["radix"] == reuse["block"] == cached
        return (
            {(part, None): fewer for part in ("question", "answer", "choices")}
            | {(part, "all_agree"): agree for part in ("question", "answer", "choices")}
            | {("choices", "compare"): reuse["block"] == reuse["radix"] > reuse["whole"]}
        )
    if chapter.key == "speculative":  # greedy: the answer is plain decoding's; the free answer guesses worse
        lang, chat = at.session_state["w_lang"], at.session_state["w_chat"]
        equal = plain_answer_equal(run.model, lang, chat, chapter.step)
        worse = free_guesses_worse(run.model, lang, chat)
        return {
            ("claim", None): equal and chapter.step > 1,
            ("claim", "prefill_only"): chapter.step == 1,
            ("claim", "sampled"): False,
            ("question", None): worse,
            ("answer", None): worse,
        }  # lessons are greedy
    if chapter.key == "context_window":
        past = window is not None and n > window
        halves = 40 <= 100 * kv_at(run.keep) / kv_at(n) <= 60 and 20 <= 100 * run.scores(run.keep) / run.scores(n) <= 35
        return {
            ("body", None): window is None,
            ("look", None): window is None,
            ("body", "windowed"): window is not None,
            ("look", "windowed"): window is not None,
            ("question", None): n >= 2,
            ("question", "one_token"): n < 2,
            ("answer", "one_token"): n < 2,
            ("answer", None): n >= 2 and not past and halves,
            ("answer", "past_window"): n >= 2 and past,
            ("answer", "rough"): n >= 2 and not past,
            ("choices", None): n >= 2 and not past,
            ("choices", "one_token"): n < 2,
            ("choices", "past_window"): n >= 2
            and past
            and (2 * kv_at(run.keep) > kv_at(n) and 2 * run.scores(run.keep) < run.scores(n)),
        }
    if chapter.key == "sliding_window":  # its own text once a local block went back to the pool
        has = window is not None
        handed_back = has and context - window + 1 >= chapter.settings["block_size"]
        return (
            {(part, None): handed_back for part in ("body", "look", "claim")}
            | {(part, "inside_window"): has and not handed_back for part in ("body", "look", "claim")}
            | {(part, None): has for part in ("question", "answer", "choices")}
            | {(part, "no_window"): not has for part in ("body", "look", "claim", "question", "answer", "choices")}
        )
    return {}


def shown_parts(at, lang: str) -> dict[str, str]:
    """The chapter's parts as the panel shows them (Markdown), each without its label; the choices one per line, each
    after its letter ("**A** · "), and the answer after the right choice's letter."""
    body, look, claim, question, choices, answer = [m.value for m in at.container("chapter").markdown]
    labels = {"look": "lesson_look", "claim": "lesson_claim", "question": "lesson_question"}
    shown = dict(body=body, look=look, claim=claim, question=question, choices=choices, answer=answer)
    for part, key in labels.items():
        prefix = f"**{strings.t(key, lang)}** "
        assert shown[part].startswith(prefix), (part, shown[part])
        shown[part] = shown[part][len(prefix) :]
    return shown


def shown_choices(chapter, lang: str, choices: str, answer: str) -> list[str | None]:
    """Which of the chapter's lists of choices (its own: None, or a variant's) the panel shows, in the chapter's order
    and each after its letter; and the answer must follow the letter of that list's right choice, its first."""
    lines = choices.split("  \n")
    own = chapter.text[lang]
    found = []
    for variant in [None] + [v for v in chapter.variants if "choices" in own[v]]:
        templates = own[variant]["choices"] if variant else own["choices"]
        order = chapter.choice_order(len(templates))
        if len(lines) == len(templates) and all(
            template_pattern(f"**{LETTERS[k]}** · {templates[i]}").fullmatch(line)
            for k, (i, line) in enumerate(zip(order, lines))
        ):
            assert answer.startswith(f"**{LETTERS[order.index(0)]}** · "), (answer, variant)
            found.append(variant)
    return found


def template_pattern(template: str) -> re.Pattern:
    """A chapter's template as a pattern its filled text matches: each placeholder any text."""
    return re.compile(".*?".join(re.escape(piece) for piece in re.split(r"{[^{}]*}", template)), re.S)


def shown_variant(chapter, part: str, lang: str, text: str) -> list[str | None]:
    """Which of the chapter's texts for `part` (its own: None, or a variant's) `text` is."""
    own = chapter.text[lang]
    candidates = [None] + [v for v in getattr(chapter, "variants", ()) if part in own[v]]
    return [v for v in candidates if template_pattern(own[v][part] if v else own[part]).fullmatch(text)]


def split_note_holds(run: Run, answer: str) -> None:
    """Chapter 3's answer names one token of the run: a character it split over several tokens, or a token of
    several characters; the run's own cells (the engine's grouping) must bear it out."""
    quoted = re.search(r"“([^”]+)”\D*(\d+)", plain(answer))
    if quoted is None:
        return  # the run has no such token: the answer says nothing of it
    text, count = quoted.group(1), int(quoted.group(2))
    cells = token_cells(run.model.tokenizer, run.shown[: run.n], run.shown[run.n :])
    assert any(c.group.text == text and c.group.size == count for c in cells) or any(
        c.text.strip() == text and len(text) == count for c in cells
    ), (text, count)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.key)
def test_every_chapter_tells_the_truth_of_its_run(chapter, page, request):
    """Every chapter opens from its link in its state, with no warning; the numbers in its text are the run's
    (and its figure's: tests below check the figures' data equal the same numbers), and every part of it that
    holds only on some runs (a question's premise, a sentence about a window) holds on this one."""
    model_name, lang = page
    model = request.getfixturevalue(FIXTURES[model_name])
    at = start(chapter=chapter.number, **page_link(model_name, lang))
    assert_clean(at)
    assert not at.warning, [w.value for w in at.warning]  # nobody's link asked for anything the model lacks
    state, problems = parse_query(dict(at.query_params.items()))
    assert not problems and state.chapter == chapter.number
    block_size = CASE_BLOCK_SIZE if chapter.case else chapter.settings["block_size"]
    assert (state.view, state.step, state.block_size, state.kv_splits) == (
        chapter.view,
        chapter.step,
        block_size,
        chapter.settings["kv_splits"],
    )
    if chapter.case:
        assert state.prompt == CASES[chapter.case] and not state.chat
    assert strings.t(VIEW_TITLES[chapter.view], lang) in [s.value for s in at.subheader]
    tells_the_truth(at, chapter, model, lang)


def tells_the_truth(at, chapter, model: engine.Model, lang: str, prompt: str | None = None) -> None:
    """The chapter's text on the page quotes the numbers of the run (of `prompt`, else the language's default), and
    every part of it shown (its own or a variant's) has a premise that holds on that run."""
    text = lesson_text(at)
    assert chapter.part("title", lang) in text
    assert "{" not in text and "–" not in text  # every placeholder was filled with a number of this step
    run = run_of(chapter, model, lang, prompt)
    missing = [number for number in expected_numbers(chapter, run, at) if number not in plain(text)]
    assert not missing, (missing, text)
    shown = shown_parts(at, lang)
    holds = premises(chapter, run, at)
    which = shown_choices(chapter, lang, shown.pop("choices"), shown["answer"])
    assert len(which) == 1 and holds.get(("choices", which[0]), True), (which, chapter.key)
    shown["answer"] = shown["answer"].split(" · ", 1)[1]
    for part, shown_text in shown.items():
        which = shown_variant(chapter, part, lang, shown_text)
        assert len(which) == 1, (part, which, shown_text)
        assert holds.get((part, which[0]), True), (f"the {part} shown does not hold on this run", shown_text)
    if chapter.key == "decode":
        split_note_holds(run, shown["answer"])
    if lang == "zh":
        assert not english_left([text]), english_left([text])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p[0]}-{p[1]}")
def test_the_fixed_weights_chapter_quotes_and_draws_the_cosines_transformers_computes(page, request):
    """The same token in two contexts, on each embedded model: transformers' own keys (before RoPE, from hooks) and
    values are the same at layer 0 and differ from layer 1 on; the chapter's five cosines and its chart's three lines
    are transformers' (float32: to the text's three decimals; bfloat16, Gemma: to 1e-2, as two implementations'
    bfloat16 passes round apart through the layers)."""
    model_name, lang = page
    model = request.getfixturevalue(FIXTURES[model_name])
    at = start(chapter=number_of("contexts"), **page_link(model_name, lang))
    assert_clean(at)
    _, cos = contexts_numbers(model, model_name, lang)
    assert cos["unrotated"][0] > 1 - 1e-6 and cos["values"][0] > 1 - 1e-6  # layer 0: the same key and value
    assert cos["keys"][0] < 1 - 1e-4  # turned by two positions
    assert max(cos["unrotated"][1:]) < 1 - 1e-4 and max(cos["values"][1:]) < 1 - 1e-4  # then differing
    quoted = [float(x) for x in re.findall(r"(?<![\d.])[01]\.\d{3}(?![\d])", plain(lesson_text(at)))]
    expected = [
        cos["keys"][0],
        min(cos["unrotated"][1:]),
        min(cos["values"][1:]),
        cos["unrotated"][-1],
        cos["values"][-1],
    ]
    close = 1e-2 if model.dtype == torch.bfloat16 else 1e-3
    assert quoted == pytest.approx(expected, abs=close), (quoted, expected)
    same = [float(x) for x in re.findall(r"(?<![\d.])[01]\.\d{5}(?![\d])", plain(lesson_text(at)))]
    assert same == pytest.approx([cos["unrotated"][0], cos["values"][0]], abs=1e-5), same  # layer 0, before RoPE
    chart = next(c for c in charts(at) if c["data"][0]["type"] == "scatter")
    lines = [np.asarray(matrix(trace["y"]), dtype=float) for trace in chart["data"]]  # before RoPE, cached K, V
    for line, name in zip(lines, ("unrotated", "keys", "values"), strict=True):
        np.testing.assert_allclose(line, cos[name], atol=close / 10 if model.dtype == torch.float32 else close)


def test_on_a_model_with_learned_positions_the_fixed_weights_chapter_says_layer_0_differs(
    tiny_model, tiny_model_dir, monkeypatch
):
    """GPT-2 adds a position's row to the embedding: the chapter's variant for it is shown (not "the same at layer
    0"), with the values' cosine at layer 0 that its figure draws, in both languages."""
    folder = tiny_model_dir("gpt2")
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    chapter = CHAPTERS[number_of("contexts") - 1]
    for lang in ("en", "zh"):
        at = start(chapter=chapter.number, model=folder, lang=lang, chat=0)
        assert_clean(at)
        shown = shown_parts(at, lang)
        assert shown_variant(chapter, "body", lang, shown["body"]) == ["learned"], shown["body"]
        chart = next(c for c in charts(at) if c["data"][0]["type"] == "scatter")
        assert len(chart["data"]) == 2  # no keys before RoPE: there is no RoPE
        v0 = float(np.asarray(matrix(chart["data"][1]["y"]), dtype=float)[0])
        assert v0 < 1 - 1e-3 and f"{v0:.3f}" in plain(shown["body"])


LONG_PROMPT = "什么是 KV 缓存？KV 缓存是一种用来存放注意力键和值的结构。" * 36  # over 600 of Gemma 3's tokens


@pytest.mark.parametrize(
    "key", ["prefill", "attention", "kv_cache", "long_context", "context_window", "sliding_window"]
)
def test_past_the_window_the_chapters_say_so(key, embedded_zh_model, monkeypatch):
    """With the host's limits raised (as a host may) and a prompt longer than Gemma 3's window of 512, the chapters
    that speak of what every layer keeps say which layers keep only their window, and their variants for a run
    past it (the K/V does not double or halve with the length, the band on a local layer's heatmap) hold."""
    monkeypatch.setenv("KVSCOPE_MAX_PROMPT_TOKENS", "2000")
    monkeypatch.setenv("KVSCOPE_CACHE_TOKENS", "4096")
    chapter = next(c for c in CHAPTERS if c.key == key)
    assert len(embedded_zh_model.tokenizer.encode(LONG_PROMPT)) > 512
    at = start(chapter=chapter.number, lang="zh", prompt=LONG_PROMPT)
    assert_clean(at)
    assert not at.warning, [w.value for w in at.warning]
    tells_the_truth(at, chapter, embedded_zh_model, "zh", LONG_PROMPT)
    chosen = [v for v in chapter.variants if v in ("window_doubling", "past_window")]
    if chosen:  # the run past the window is the one these variants are for, its question's right choice too
        shown = shown_parts(at, "zh")
        unlettered = shown | {"answer": shown["answer"].split(" · ", 1)[1]}  # the answer after its choice's letter
        assert any(
            template_pattern(chapter.text["zh"][chosen[0]][part]).fullmatch(text)
            for part, text in unlettered.items()
            if part != "choices" and part in chapter.text["zh"][chosen[0]]
        ), key
        assert shown_choices(chapter, "zh", shown["choices"], shown["answer"]) == [chosen[0]], key


def test_chapters_tell_different_things_and_cover_every_teaching_point():
    bodies = [c.part("body", lang) for c in CHAPTERS for lang in ("en", "zh")]
    assert len(set(bodies)) == len(bodies) and len(CHAPTERS) >= 10
    assert {p for c in CHAPTERS for p in c.points} == {f"T{i}" for i in range(1, 20)}
    for c in CHAPTERS:  # the same placeholders in both languages: a number is never missing in one of them
        for variant in (None, *c.variants):
            texts = [c.text[lang][variant] if variant else c.text[lang] for lang in ("en", "zh")]
            assert {k for k, v in texts[0].items() if isinstance(v, str)} == {
                k for k, v in texts[1].items() if isinstance(v, str)
            }, (c.key, variant)  # the same parts
            for part in ("body", "look", "claim", "question", "answer"):
                if part not in texts[0]:
                    continue
                names = [set(re.findall(r"{(\w+)", text[part])) for text in texts]
                assert names[0] == names[1], (c.key, variant, part)


def test_counts_are_grouped_by_thousands_and_ids_are_not():
    """A Qwen3-shaped model's 1024-wide vectors read "1,024" wherever a chapter quotes them, formatted or not; a token
    id stays as the vocabulary writes it, and a number the run lacks is a dash."""
    assert fill(
        "{hidden} × {vocab:,}; position {position}, id {id}; {missing}",
        {"hidden": 1024, "vocab": 151936, "position": 12345, "id": 15234},
    ) == ("1,024 × 151,936; position 12,345, id 15234; –")
    assert fill("{adds} adds, {ratio:.1f}, {layers:>3}", {"adds": 56, "ratio": 0.25, "layers": 1}) == (
        "56 adds, 0.2,   1"
    )


def test_every_variant_is_checked_against_its_run():
    """A chapter's variant replaces its own text only where the run calls for it: each one that says something
    about the run (its question's premise) has that premise in `premises`, so a new variant comes with its check."""
    unchecked = {"prefix_case1": set()}
    checked = {
        "prefill": {"one_token"},
        "residual": {"post_norms"},
        "gqa": {"mha"},
        "long_context": {"window_doubling"},
        "prefix_case1": {"all_agree", "compare"},
        "context_window": {"windowed", "rough", "past_window", "one_token"},
        "sliding_window": {"inside_window", "no_window"},
        "evicting": {"weak_sink"},
        "contexts": {"learned"},
        "speculative": {"prefill_only", "sampled"},
    }
    for c in CHAPTERS:
        assert set(c.variants) == checked.get(c.key, set()) | unchecked.get(c.key, set()), c.key


def test_every_question_has_two_to_four_choices_in_both_languages():
    """The class votes on every chapter's question: 2 to 4 choices, distinct, as many in Chinese as in English, for
    the chapter's own question and for each variant that has its own (one that changes which choice is right)."""
    for c in CHAPTERS:
        for variant in (None, *[v for v in c.variants if "choices" in c.text["en"][v]]):
            lists = [c.choices(lang, [variant] if variant else []) for lang in ("en", "zh")]
            assert 2 <= len(lists[0]) == len(lists[1]) <= len(LETTERS), (c.key, variant)
            assert all(len(set(choices)) == len(choices) for choices in lists), (c.key, variant)
            assert not english_left(lists[1]), (c.key, variant)
            assert variant is None or "choices" in c.text["zh"][variant], (c.key, variant)


def test_the_growth_chart_is_the_chapters_numbers(embedded_model, embedded_zh_model):
    """Chapter 14's chart (the costs view's growth figure) draws the numbers its text quotes: the K/V and the
    attention scores at the model's limit, and on Gemma 3 a point at the window, where the K/V line bends, and
    scores that grow only linearly past it in the local layers (computed here, counting each query's keys)."""
    from viz.costs import context_growth_frame, growth_lengths

    chapter = next(c for c in CHAPTERS if c.key == "context_window")
    for model in (embedded_model, embedded_zh_model):
        run = run_of(chapter, model, "en")
        info = model.info
        frame = context_growth_frame(info, growth_lengths(info)).set_index("tokens")
        for length in {info.context_limit, run.window or info.context_limit, 1}:
            assert frame.loc[length, "KV cache MiB"] == run.kv_at(length) / 2**20, (info.name, length)
            assert frame.loc[length, "attention scores (millions)"] == pytest.approx(run.scores(length) / 1e6), length
        if run.window:
            per_token = frame["KV cache MiB"].diff() / frame.index.to_series().diff()
            assert per_token.loc[run.window] > 3 * per_token.loc[info.context_limit]  # the bend


def test_walking_from_the_cases_to_the_window_chapter_on_gemma_raises_no_warning(embedded_zh_model):
    """The two case chapters load the article's cases (chat off); the chapters after them put the lesson's prompt
    back with the chat switch the page had. On Gemma 3 (no chat template) that is off: no "chat=1" problem
    appears that nobody's link asked for, in Chinese and in English, forward and back."""
    for lang in ("zh", "en"):
        at = start(chapter=number_of("prefix_case1"), **page_link("embedded-zh", lang))
        for move in ["b_chapter_next"] * 3 + ["b_chapter_back"] * 3 + ["b_chapter_next"] * 3:
            at.button(key=move).click().run()
            assert_clean(at)
            assert not at.warning, (lang, at.query_params["chapter"], [w.value for w in at.warning])
        assert at.query_params["chapter"] == str(number_of("sliding_window")) and at.session_state["w_chat"] is False
    plain_page = start(model="embedded-zh", lang="en")  # the English default (chat on) on a base model
    assert_clean(plain_page)
    assert not plain_page.warning, [w.value for w in plain_page.warning]
    asked = start(model="embedded-zh", lang="en", chat=1)  # a link that asks: told why it cannot
    assert [w for w in asked.warning if "chat=1" in w.value]


def test_an_engine_error_is_in_the_pages_language_and_the_lesson_stays(embedded_model, embedded_zh_model):
    """A prompt longer than the host allows: the chapter keeps its title and its buttons, the error is in the
    page's language with its numbers, and one press puts the lesson's own prompt back."""
    from ui.host.limits import load_limits, model_limits

    for lang, prompt, model in (
        ("zh", "什么是 KV 缓存？" * 300, embedded_zh_model),
        ("en", "What is a KV cache? " * 300, embedded_model),
    ):
        allowed = model_limits(load_limits(), model.info).max_prompt_tokens  # each model its own
        window = CHAPTERS[number_of("sliding_window") - 1]
        at = start(chapter=window.number, lang=lang, prompt=prompt)
        assert not at.exception, at.exception
        assert [t.value for t in at.title] == [f"{window.number}/{len(CHAPTERS)} · {window.part('title', lang)}"]
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and f"{allowed}" in errors[0], errors
        if lang == "zh":
            assert not re.search(r"[A-Za-z]{3,}", errors[0].replace("token", "")), errors  # no English left
        assert not at.button(key="b_chapter_back").disabled
        at.button(key="b_lesson_prompt").click().run()
        assert_clean(at)
        assert at.session_state["w_prompt"] == default_prompt(lang) and at.query_params["chapter"] == str(window.number)
        assert at.container("chapter").markdown  # the chapter's text is back


def test_a_lesson_link_opens_chapter_one(embedded_model):
    """`?lesson=1`, as a teacher might type it, opens chapter 1 (and writes the link the page uses)."""
    at = start(lesson=1)
    assert_clean(at)
    assert at.query_params["chapter"] == "1" and "lesson" not in at.query_params
    assert CHAPTERS[0].part("title", "en") in [t.value for t in at.title][0]
    wrong = start(lesson="x")  # a problem names what the link asked
    assert [w for w in wrong.warning if "lesson=x" in w.value]


def test_a_lone_byte_chip_is_explained(embedded_model):
    """On SmolLM2, Case 2's first answer token can be a character's first bytes (⟨ef bc⟩ of "，"): where the run's
    last token leaves a character unfinished (the engine's grouping), the chapter says what the chip is."""
    chapter = next(c for c in CHAPTERS if c.key == "prefix_case2")
    generation, _ = decode(embedded_model, CASES["case2"], 0, chat=False, block_size=CASE_BLOCK_SIZE)
    cells = token_cells(embedded_model.tokenizer, generation.prompt_ids, generation.generated[:1])
    at = start(chapter=chapter.number)
    captions = [c.value for c in at.container("chapter").caption]
    if cells[-1].group.state == "unfinished":
        assert any(cells[-1].group.text in plain(c) for c in captions), captions
    else:
        assert not captions, captions


@pytest.mark.parametrize("value", ["abc", "99", "-1", "2.5"])
def test_a_malformed_chapter_falls_back_with_a_message(value, embedded_model):
    at = start(chapter=value)
    assert_clean(at)
    assert any("chapter" in w.value for w in at.warning), [w.value for w in at.warning]


def test_a_link_to_a_chapter_with_another_view_opens_the_chapters_view_and_figure(embedded_model):
    """The chapter sets the view (its selector is hidden in the lesson): a hand-edited link naming another view still
    shows the chapter's figure, not an empty place; the link's other values stay."""
    chapter = CHAPTERS[number_of("paging") - 1]  # its figure is the pool, in the paged-KV view
    at = start(chapter=chapter.number, view="flow", step=5)
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step) == (chapter.number, chapter.view, 5)
    assert strings.t(VIEW_TITLES[chapter.view]) in [s.value for s in at.subheader]
    assert at.get("plotly_chart"), "the chapter's figure is drawn"


def test_leaving_the_lesson_keeps_the_page_as_it_is(embedded_model):
    at = start(chapter=number_of("paging"))  # kv view, step 6, blocks of 4
    at.button(key="b_lesson_leave").click().run()
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step, state.block_size) == (0, "kv", 6, 4)
    assert "chapter" not in at.query_params


# -- in a real browser ----------------------------------------------------------------------------------


def chapter_in_link(page, number: int | None) -> None:
    expected = "null" if number is None else f"'{number}'"
    page.wait_for_function(f"() => new URL(location.href).searchParams.get('chapter') === {expected}", timeout=WAIT_MS)
    settled_text(page)


def open_sidebar(page) -> None:
    """The lesson's sidebar (the chapter list, the way out) starts closed: open it as a teacher would (»)."""
    if page.locator('[data-testid="stSidebar"][data-collapsed="true"]').count():
        page.locator('[data-testid="stExpandSidebarButton"]').click()
    expect(page.locator('[data-testid="stSidebar"][data-collapsed="false"]')).to_have_count(1)


def shows_chapter(page, number: int) -> None:
    title = CHAPTERS[number - 1].part("title", "en")
    expect(page.locator("h1").get_by_text(title)).to_be_visible(timeout=WAIT_MS)


@pytest.mark.browser
def test_keys_buttons_and_the_list_move_through_the_chapters(server):
    """A chapter that keeps the sidebar's settings runs the step alone (no sidebar widget is sent: top-p's key);
    the list in the sidebar, drawn before those moves, still goes to any chapter; a chapter with other settings
    (a case, another split count) runs the whole page."""
    with browser_page() as page:
        sent = Received(page)
        page.goto(f"{server}/")
        settled_text(page)
        press(page, "b_lesson_start")
        chapter_in_link(page, 1)
        shows_chapter(page, 1)
        page.locator("h1").first.click()  # focus on the page, not a field, as a presenter's clicker would
        sent.clear()
        page.keyboard.press("PageDown")
        chapter_in_link(page, 2)
        shows_chapter(page, 2)
        assert sent.carries("kv-counter") and not sent.carries("w_top_p")
        page.keyboard.press("PageUp")
        chapter_in_link(page, 1)
        press(page, "b_chapter_next")
        chapter_in_link(page, 2)
        open_sidebar(page)
        page.locator(".st-key-b_toc_1 button").click()  # the chapter the sidebar was last drawn on
        chapter_in_link(page, 1)
        case1 = number_of("prefix_case1")
        page.locator(f".st-key-b_toc_{case1} button").click()
        chapter_in_link(page, case1)  # the article's Case 1, loaded on entering
        shows_chapter(page, case1)
        params = dict(p.split("=", 1) for p in page.url.split("?", 1)[1].split("&"))
        assert (params["view"], params["block_size"], params["step"]) == ("prefix", "4", "1")
        sent.clear()
        press(page, "b_chapter_back")
        chapter_in_link(page, number_of("split_kv"))
        assert "view=split" in page.url and "kv_splits=4" in page.url
        assert sent.carries("w_top_p")
        open_sidebar(page)
        press(page, "b_lesson_leave")
        chapter_in_link(page, None)
        assert "view=split" in page.url and "kv_splits=4" in page.url  # leaving keeps the state
        expect(page.locator(".st-key-b_lesson_start")).to_be_visible()


def test_play_keeps_the_chapter_current_and_the_list_still_moves(embedded_model):
    at = start(chapter=3)
    at.toggle(key="p_playing").set_value(True).run()
    at.run()  # Play's ticks redraw the step with its chapter: the panel quotes the step on screen
    assert_clean(at)
    assert at.query_params["chapter"] == "3" and at.query_params["step"] == "5"
    _, trace = own_trace(embedded_model, default_prompt("en"), 5, 16, 1)
    text = lesson_text(at)
    assert f"{trace.token_id}," in text and f"position {trace.positions[-1]}." in text, text
    at.toggle(key="p_playing").set_value(False).run()
    at.button(key="b_toc_7").click().run()
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step) == (7, "attention", 4)


def test_the_tokens_chapter_explains_byte_level_bpe_when_a_character_spans_several_tokens(embedded_model):
    tokenizer = embedded_model.tokenizer
    split = any(len(tokenizer.encode(ch)) > 1 for ch in "解释什么是")  # the tokenizer's own verdict
    assert split  # SmolLM2 splits these characters: the chapter must say why
    at = start(chapter=1, prompt="解释什么是Transformer", chat=0)
    assert strings.t("bpe_explained") in [c.value for c in at.container("chapter").caption]
    plain = start(chapter=1, prompt="Hello there", chat=0)
    assert strings.t("bpe_explained") not in [c.value for c in plain.container("chapter").caption]


def drawn_parts(at) -> tuple[int, int]:
    """Charts and tables (st.table and st.dataframe) on the page, but for the model card's at the foot."""
    card = next(e for e in at.expander if e.label == strings.t("card_title"))
    return len(at.get("plotly_chart")), len(at.table) + len(at.dataframe) - len(card.table) - len(card.dataframe)


def test_the_whole_view_under_a_chapter_is_built_only_once_opened_and_then_stays_open(embedded_model):
    """A chapter draws its own figure, the step's text and its controls; the view's other figures and tables (and
    the costs view's timing, measured when shown) only once the whole view under it is opened, which then stays
    open from chapter to chapter, both ways."""
    at = start(chapter=1)
    closed = {}
    for chapter in CHAPTERS:
        if chapter.number > 1:
            at.button(key="b_chapter_next").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(chapter.number)
        closed[chapter.number] = drawn_parts(at)
        assert sum(closed[chapter.number]) == 1, (chapter.key, closed[chapter.number])  # the chapter's figure alone
        assert strings.t("decode_step") not in [m.label for m in at.metric], chapter.key  # nothing timed
        assert bool(at.code) == (chapter.view != "serving"), chapter.key  # the text so far (Serving: its requests')
    at = open_whole_view(at)
    for chapter in reversed(CHAPTERS):
        if chapter.number < len(CHAPTERS):
            at.button(key="b_chapter_back").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(chapter.number)
        charts, tables = drawn_parts(at)
        assert charts >= closed[chapter.number][0] and charts + tables > 1 + sum(closed[chapter.number]), chapter.key
        if chapter.view == "costs":
            assert strings.t("decode_step") in [m.label for m in at.metric], chapter.key  # measured, shown


def test_a_revisited_chapter_reads_the_run_its_first_visit_computed(embedded_model, monkeypatch):
    """PageDown through the lesson, a case included, then PageUp back: every chapter's run is built on its first
    visit only (the store's count of builds does not move on the way back), and shows the same step's token.
    The store of its own (its size is part of its key) has room for them all: this is not about eviction."""
    monkeypatch.setenv("KVSCOPE_SHARED_RUNS_MB", "4321")
    first, last = number_of("paging"), number_of("prefix_case2")  # paging, costs, split-KV and both cases
    at = start(chapter=first)
    store = at.session_state["page"].runner.runs
    seen = {}
    for number in range(first, last + 1):
        if number > first:
            at.button(key="b_chapter_next").click().run()
        assert_clean(at)
        seen[number] = at.query_params["step"], at.session_state["page"].runner.generation.generated[:]
    built = store.built
    for number in range(last - 1, first - 1, -1):  # back to the first: all visited
        at.button(key="b_chapter_back").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(number)
        assert (at.query_params["step"], at.session_state["page"].runner.generation.generated[:]) == seen[number]
    assert store.built == built


@pytest.mark.parametrize("link", [{}, {"layer": 3, "head": 2}], ids=["focused head", "head from the link"])
def test_the_split_chapter_quotes_the_head_its_figure_shows(link, embedded_model):
    """Issue 18: the panel quoted the maximum over all layers and heads beside a figure of one head. Now it quotes
    the shown head (the view's own pickers and metric say which, and its number), and the maximum, labelled."""
    import math

    chapter = next(c for c in CHAPTERS if c.key == "split_kv")
    at = open_whole_view(start(chapter=chapter.number, **link))
    assert_clean(at)
    layer, head = at.number_input(key="w_layer").value, at.number_input(key="w_head").value
    if link:
        assert (layer, head) == (link["layer"], link["head"])
    _, trace = own_trace(
        embedded_model,
        default_prompt("en"),
        chapter.step,
        chapter.settings["block_size"],
        chapter.settings["kv_splits"],
    )
    diffs = (trace.split.merged - trace.split.unsplit).abs().amax(dim=-1)  # (layers, heads)
    shown = f"{diffs[layer, head].item():.1e}"
    assert [m.value for m in at.metric if m.label == strings.t("max_diff")] == [shown]  # the view beside it
    text = lesson_text(at)
    assert f"(layer {layer}, Q head {head}) merged and unsplit differ by at most {shown}" in text, text
    top = int(diffs.argmax())
    where = (top // diffs.shape[1], top % diffs.shape[1])
    if where == (layer, head):
        assert f"{shown}, the largest over all {diffs.shape[0]} layers and {diffs.shape[1]} Q heads." in text, text
    else:
        assert f"the largest is {diffs.max().item():.1e} (layer {where[0]}, Q head {where[1]})" in text, text
    # the view's worked example, computed here by hand: softmax(K q / √2) V over its four keys
    from engine.split_kv import EXAMPLE_KEYS, EXAMPLE_QUERY, EXAMPLE_VALUES

    scores = [sum(k * q for k, q in zip(key, EXAMPLE_QUERY)) / math.sqrt(2) for key in EXAMPLE_KEYS]
    weights = [math.exp(s) / sum(math.exp(x) for x in scores) for s in scores]
    out = [sum(w * v[d] for w, v in zip(weights, EXAMPLE_VALUES)) for d in range(2)]
    assert f"unsplit [{out[0]:.3f}, {out[1]:.3f}]" in text and "example in the whole view below is our own" in text, (
        text
    )
