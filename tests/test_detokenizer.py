"""Incremental text: no broken characters while a CJK character or emoji is still incomplete, and the
pieces join to the answer decoded after its prompt, for each family's tokenizer."""

import json
import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import engine
from engine.characters import REPLACEMENT
from engine.detokenizer import IncrementalDetokenizer
from engine.sampler import filter_logits

TEXT = "解释什么是Transformer，举个例子 🤖🚀 大语言模型 👩‍👩‍👧"
PROMPT = "Explain with an example:"
FAMILIES = ["embedded", "gpt2", "qwen", "llama"]
ENGLISH = [
    "The cache holds the keys and values of every layer.",
    "Each new token reads the whole history.",
    "Prefill computes all prompt tokens in one pass, then decode adds one token per step.",
]


@pytest.fixture(scope="module")
def family_tokenizers(tokenizer) -> dict:
    """Each family's tokenizer class with its own decoder: GPT-2 and Qwen2/3 byte-level BPE over the
    embedded SmolLM2 vocabulary (SmolLM2 and Llama 3 are byte-level too: "embedded"), and a Llama 2
    style SentencePiece BPE (Metaspace, byte fallback) trained here on English only, so CJK and emoji
    fall back to one id per byte."""
    from transformers import GPT2Tokenizer, LlamaTokenizer, Qwen2Tokenizer

    smollm = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [tuple(pair) for pair in smollm["merges"]]
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trained.train_from_iterator(ENGLISH, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    pieces = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in sorted(pieces["vocab"], key=pieces["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    return {
        "embedded": tokenizer,
        "gpt2": GPT2Tokenizer(vocab=smollm["vocab"], merges=merges),
        "qwen": Qwen2Tokenizer(vocab=smollm["vocab"], merges=merges),
        "llama": LlamaTokenizer(vocab=vocab, merges=[tuple(pair) for pair in pieces["merges"]]),
    }


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def in_context(tokenizer, prompt: list[int], answer: list[int]) -> str:
    """The answer's text as `decode(prompt + answer)` shows it after `decode(prompt)`."""
    before, whole = tokenizer.decode(prompt), tokenizer.decode(prompt + answer)
    assert whole.startswith(before)
    return whole[len(before) :]


def pieces_of(detokenizer: IncrementalDetokenizer, answer: list[int]) -> list[str]:
    return [detokenizer.add(token_id, final=i == len(answer) - 1) for i, token_id in enumerate(answer)]


@pytest.mark.parametrize("family", FAMILIES)
def test_pieces_never_break_a_character_and_join_to_the_full_decode(family, family_tokenizers):
    tokenizer = family_tokenizers[family]
    ids = encode(tokenizer, TEXT)
    partial = [tokenizer.decode(ids[: i + 1]) for i in range(len(ids))]
    assert any(p.endswith(REPLACEMENT) for p in partial), "the text should split characters across tokens"
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, PROMPT))
    pieces = [detok.add(i) for i in ids]
    assert all(REPLACEMENT not in p for p in pieces)
    assert "" in pieces  # held back while a character was incomplete
    assert tokenizer.decode(ids) == TEXT
    if family == "llama":
        # Encoded alone, the text starts with SentencePiece's "▁" (a space): decode() strips a text's first
        # space, but after the prompt it is real text, and the first piece keeps it.
        assert tokenizer.convert_ids_to_tokens(ids[0]).startswith("▁")
        assert "".join(pieces) == " " + TEXT
    else:
        assert "".join(pieces) == TEXT


def test_unfinished_character_at_the_end_is_flushed(tokenizer):
    ids = encode(tokenizer, "🤖")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, PROMPT))
    pieces = pieces_of(detok, ids[:-1])
    assert pieces[:-1] == [""] * (len(ids) - 2)
    assert "".join(pieces) == tokenizer.decode(ids[:-1])  # the final decode itself is broken: shown as is


def test_a_character_the_prompt_leaves_unfinished_is_shown_with_the_answer_not_the_prompt(tokenizer):
    ids = encode(tokenizer, PROMPT + " 🤖")
    assert tokenizer.decode(ids[:-1]).endswith(REPLACEMENT)
    answer = ids[-1:] + encode(tokenizer, " ok")
    detok = IncrementalDetokenizer(tokenizer, ids[:-1])
    # The prompt's unfinished last ids (a space and the emoji's first bytes) come with the answer.
    assert "".join(pieces_of(detok, answer)) == " 🤖 ok"


def random_answer(tokenizer, family: str, rng: random.Random, length: int = 24) -> list[int]:
    """Ids drawn from the whole vocabulary and from the byte pieces of CJK and emoji. For SentencePiece,
    bytes come only as whole characters: a byte run that is not UTF-8 is the case pinned below."""
    if family == "llama":
        units = [encode(tokenizer, char)[1:] for char in TEXT if char != " "]  # without the leading "▁"
        byte_ids = set(tokenizer.convert_tokens_to_ids([f"<0x{b:02X}>" for b in range(256)]))
        words = [[i] for i in range(len(tokenizer)) if i not in byte_ids]
    else:
        units, words = [[i] for i in encode(tokenizer, TEXT)], [[i] for i in range(len(tokenizer))]
    answer: list[int] = []
    while len(answer) < length:
        answer += rng.choice(units) if rng.random() < 0.7 else rng.choice(words)
    return answer


@pytest.mark.parametrize("family", FAMILIES)
def test_random_answers_are_never_taken_back_and_join_to_the_decode_after_the_prompt(family, family_tokenizers):
    """The text shown after each id is a prefix of the answer decoded after the prompt (a piece never
    shows a character that a later byte changes), and the pieces join to it; for byte-level tokenizers
    that is `decode(answer)`, for SentencePiece `decode(answer)` with the first space it strips."""
    tokenizer = family_tokenizers[family]
    prompt = encode(tokenizer, PROMPT)
    rng = random.Random(family)
    broken = 0
    for _ in range(40):
        answer = random_answer(tokenizer, family, rng)
        pieces = pieces_of(IncrementalDetokenizer(tokenizer, prompt), answer)
        full = in_context(tokenizer, prompt, answer)
        assert all(full.startswith("".join(pieces[:count])) for count in range(len(pieces)))
        assert "".join(pieces) == full
        alone = tokenizer.decode(answer)
        assert full == alone or (family == "llama" and full == " " + alone)
        broken += any(tokenizer.decode(answer[:count]).endswith(REPLACEMENT) for count in range(1, len(answer)))
    assert broken > 10, "the answers should often stop inside a character"


def test_sentencepiece_bytes_that_are_not_utf8_never_take_back_a_character_shown(family_tokenizers):
    """SentencePiece's byte fallback decodes a run of byte ids that is not UTF-8 as U+FFFD for every byte
    of it, so `decode` turns a "解" already shown into U+FFFD once a stray byte follows. The pieces keep
    "解" and show the stray byte as one U+FFFD (as Python's own UTF-8 decoding does)."""
    tokenizer = family_tokenizers["llama"]
    answer = tokenizer.convert_tokens_to_ids(["<0xE8>", "<0xA7>", "<0xA3>", "<0xA7>", "▁", "c", "a"])
    pieces = pieces_of(IncrementalDetokenizer(tokenizer, encode(tokenizer, PROMPT)), answer)
    assert pieces[:3] == ["", "", "解"]
    assert "".join(pieces) == "解" + b"\xa7".decode("utf-8", "replace") + " ca"
    assert tokenizer.decode(answer) == REPLACEMENT * 4 + " ca"


def test_session_text_pieces_equal_the_decode_of_generated_ids(tiny_model, tokenizer):
    prompt = encode(tokenizer, TEXT)
    for seed in range(3):
        generation = engine.Generation(
            tiny_model("llama"), prompt, max_new_tokens=48, sampling=engine.Sampling(temperature=1.0, seed=seed)
        )
        pieces = [generation.prefill().text]
        while not generation.finished:
            pieces.append(generation.step().text)
        full = tokenizer.decode(generation.generated)
        assert "".join(pieces) == full == generation.text
        for count in range(len(pieces) + 1):
            assert generation.text_after(count) == "".join(pieces[:count])
            assert full.startswith(generation.text_after(count))  # nothing shown is taken back


def test_text_after_a_count_the_answer_does_not_have_is_refused(tiny_model):
    generation = engine.Generation(tiny_model("llama"), "Hello", max_new_tokens=4)
    generation.prefill()
    for count in (-1, 2, 1.0, True, "1"):
        with pytest.raises(engine.GenerationStateError, match="from 0 to 1"):
            generation.text_after(count)


def test_a_failed_step_leaves_the_held_bytes_as_they_were(tiny_model, tokenizer, monkeypatch):
    """A step that fails after its id reached the detokenizer is undone there too: the retry shows the
    text a run without the failure shows (the id is not held twice)."""
    import engine.generation

    script = encode(tokenizer, " 🤖 ok")
    assert tokenizer.decode(script[:2]).endswith(REPLACEMENT)
    monkeypatch.setattr(
        engine.generation, "sample", lambda logits, sampling, step: (script[step], filter_logits(logits, sampling))
    )

    def run(fail_at_call: int | None) -> list[str]:
        calls = []
        real = engine.generation.candidates

        def failing(*args, **kwargs):
            calls.append(None)
            if len(calls) == fail_at_call:
                raise RuntimeError("injected")
            return real(*args, **kwargs)

        monkeypatch.setattr(engine.generation, "candidates", failing)
        generation = engine.Generation(tiny_model("llama"), PROMPT, max_new_tokens=len(script))
        pieces = [generation.prefill().text]
        while not generation.finished:
            try:
                pieces.append(generation.step().text)
            except RuntimeError:
                pass
        monkeypatch.setattr(engine.generation, "candidates", real)
        return pieces + [generation.text]

    clean = run(None)
    assert clean[-1] == " 🤖 ok"
    assert run(fail_at_call=2) == clean  # step 1 holds a byte of the emoji when it fails
