"""The answer text (engine/detokenizer.py) and the token chips (engine/tokens.py) agree on where every character
ends, for any bytes split any way across tokens: both are checked against one definition that uses neither,
"a position ends a character when no later bytes can change the text decoded up to it"."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.characters import open_tail
from engine.detokenizer import IncrementalDetokenizer
from engine.tokens import token_cells

# Bytes that continue a character, one from each range a UTF-8 lead byte may require next (E0: A0–BF,
# ED: 80–9F, F0: 90–BF, F4: 80–8F): a character begun can always be finished (or broken) by one of these.
CONTINUATIONS = [bytes(c) for n in (1, 2, 3) for c in itertools.product((0x80, 0x90, 0xA0, 0xBF), repeat=n)]
# Characters whose bytes the token pieces cut anywhere: 1 to 4 bytes, U+FFFD itself, a surrogate's encoding
# (never UTF-8), an overlong form.
SAMPLES = [
    b"a",
    b" ",
    "é".encode(),
    "解".encode(),
    "€".encode(),
    "🤖".encode(),
    "\ufffd".encode(),
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xf4\x90\x80\x80",
]


def ends_a_character(raw: bytes) -> bool:
    """The definition: no continuation changes what `raw` decodes to (with U+FFFD for what is not UTF-8)."""
    text = raw.decode("utf-8", "replace")
    return all((raw + more).decode("utf-8", "replace").startswith(text) for more in CONTINUATIONS)


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level tokenizer whose vocabulary is every single byte and every slice of the sample characters'
    bytes, so a list of ids is any byte string cut at any places."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_char = bytes_to_unicode()
    pieces = {bytes([b]) for b in range(256)}
    pieces |= {s[i:j] for s in SAMPLES for i in range(len(s)) for j in range(i + 1, len(s) + 1)}
    vocab = {"".join(to_char[b] for b in piece): i for i, piece in enumerate(sorted(pieces))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.piece_ids = {piece: vocab["".join(to_char[b] for b in piece)] for piece in pieces}
    return tokenizer


pieces = st.lists(
    st.one_of(
        st.sampled_from(sorted({s[i:j] for s in SAMPLES for i in range(len(s)) for j in range(i + 1, len(s) + 1)})),
        st.binary(min_size=1, max_size=1),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(chunks=pieces, prompt_size=st.integers(0, 14))
def test_the_text_and_the_chips_end_characters_where_the_bytes_do(byte_tokenizer, chunks, prompt_size):
    ids = [byte_tokenizer.piece_ids[c] for c in chunks]
    prompt_size = min(prompt_size, len(ids) - 1)
    prompt, answer = ids[:prompt_size], ids[prompt_size:]
    ends = [ends_a_character(b"".join(chunks[:stop])) for stop in range(1, len(chunks) + 1)]

    cells = token_cells(byte_tokenizer, prompt, answer)
    group_ends = [cell.position + 1 == cell.group.stop and cell.group.state != "unfinished" for cell in cells]
    assert group_ends == ends

    detokenizer = IncrementalDetokenizer(byte_tokenizer, prompt)
    shown = [detokenizer.add(token_id) != "" for token_id in answer]  # every piece here has a byte: never ""
    assert shown == ends[prompt_size:]  # a piece shows exactly when an id ends a character
    # ... and the text it has shown when a character ends is that of the bytes after the prompt's last whole character
    whole_prompt = max([0] + [stop for stop in range(1, prompt_size + 1) if ends[stop - 1]])
    detokenizer, text = IncrementalDetokenizer(byte_tokenizer, prompt), ""
    for stop, token_id in enumerate(answer, prompt_size + 1):
        text += detokenizer.add(token_id)
        if ends[stop - 1]:
            assert text == b"".join(chunks[whole_prompt:stop]).decode("utf-8", "replace")


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"", 0),
        (b"a", 0),
        (b"\xe8", 1),
        (b"\xe8\xa7", 2),
        (b"\xe8\xa7\xa3", 0),
        (b"\xf0\x9f\xa4", 3),
        (b"\x80", 0),
        (b"\xe8\xe8", 1),
        (b"\xed\xa0", 0),
        (b"a\xf0\x9f", 2),
    ],
)
def test_open_tail_counts_the_bytes_of_a_character_still_missing_some(raw, expected):
    assert open_tail(raw) == expected
    assert ends_a_character(raw) == (expected == 0)  # the definition above says the same
