"""Incremental text: no broken characters while a CJK character or emoji is still incomplete."""

import engine
from engine.detokenizer import REPLACEMENT, IncrementalDetokenizer

TEXT = "解释什么是Transformer，举个例子 🤖🚀 大语言模型 👩‍👩‍👧"


def test_pieces_never_break_a_character_and_join_to_the_full_decode(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    partial = [tokenizer.decode(ids[: i + 1]) for i in range(len(ids))]
    assert any(p.endswith(REPLACEMENT) for p in partial), "the text should split characters across tokens"
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids]
    assert all(REPLACEMENT not in p for p in pieces)
    assert "" in pieces  # held back while a character was incomplete
    assert "".join(pieces) == tokenizer.decode(ids) == TEXT


def test_unfinished_character_at_the_end_is_flushed(tokenizer):
    ids = tokenizer.encode("🤖", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids[:-1]]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(ids[:-1])  # the final decode itself is broken: shown as is


def test_session_text_pieces_equal_the_decode_of_generated_ids(tiny_model, tokenizer):
    prompt = tokenizer.encode(TEXT, add_special_tokens=False)
    for seed in range(3):
        session = engine.DecodeSession(tiny_model("llama"), prompt, max_new_tokens=48,
                                       sampling=engine.Sampling(temperature=1.0, seed=seed))
        pieces = [session.prefill().text]
        while not session.finished:
            pieces.append(session.step().text)
        full = tokenizer.decode(session.generated)
        assert "".join(pieces) == full == session.text
        if REPLACEMENT not in full:
            assert all(REPLACEMENT not in p for p in pieces)
