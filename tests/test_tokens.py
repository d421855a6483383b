"""Token cells grouped into characters, checked against the tokenizer's own decode (issue 11).

A byte-level tokenizer splits many Chinese characters and every rare emoji over several tokens. The groups
must read as exactly the characters the tokenizer decodes, keep every position and id, never split a
character, never join more than they must, and never show U+FFFD.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.characters import REPLACEMENT
from engine.tokens import candidate_cells, token_cells
from viz.tokens import position_label, reads_as, splits_characters, token_stream_html

TEXTS = [
    "解释什么是Transformer",
    "解释什么是Transformer，举个例子 🤖🚀 大语言模型 👩‍👩‍👧",
    "mixed 文本 with naïve café, ü and 😀👍🏽 then ok",
    "emoji only 😀🫠🧬",
]


@pytest.fixture(scope="module", params=["embedded", "tiny", "trained"])
def any_tokenizer(request, tokenizer, tiny_model, trained_tokenizer):
    """The embedded model's tokenizer, a tiny conftest model's (saved and loaded from its folder) and a byte-level
    BPE trained here on a few sentences (other merges, so other splits)."""
    return {
        "embedded": lambda: tokenizer,
        "tiny": lambda: tiny_model("qwen2").tokenizer,
        "trained": lambda: trained_tokenizer,
    }[request.param]()


@pytest.fixture(scope="module")
def trained_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(["解释什么是大语言模型", "什么是注意力", "the model reads ids"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def groups_of(cells):
    """Each group once, in order."""
    seen = {}
    for c in cells:
        seen.setdefault(c.group.start, c.group)
    return list(seen.values())


def check_grouping(tokenizer, ids: list[int]) -> list:
    """The properties every grouping must have, each against `tokenizer.decode`; returns the groups."""
    cells = token_cells(tokenizer, ids, [])
    assert [c.position for c in cells] == list(range(len(ids)))
    assert [c.token_id for c in cells] == ids
    groups = groups_of(cells)
    assert [g.start for g in groups] == [0] + [g.stop for g in groups[:-1]]  # consecutive, no gaps
    assert groups[-1].stop == len(ids)
    for g in groups:
        assert g.whole
        assert g.text == tokenizer.decode(ids[g.start : g.stop])  # the group's bytes are exactly its characters
        for cut in range(g.start + 1, g.stop):  # and no smaller group would be: every inner cut splits a character
            assert tokenizer.decode(ids[g.start : cut]).endswith(REPLACEMENT)
    assert "".join(g.text for g in groups) == tokenizer.decode(ids)
    assert not any(REPLACEMENT in position_label(c) or REPLACEMENT in c.text for c in cells)
    return groups


@pytest.mark.parametrize("text", TEXTS)
def test_groups_read_as_the_tokenizers_characters(any_tokenizer, text):
    ids = any_tokenizer.encode(text, add_special_tokens=False)
    groups = check_grouping(any_tokenizer, ids)
    assert "".join(g.text for g in groups) == text


def test_the_articles_prompt_groups_into_its_characters(tokenizer):
    ids = tokenizer.encode("解释什么是Transformer", add_special_tokens=False)
    groups = check_grouping(tokenizer, ids)
    assert [g.text for g in groups][:5] == list("解释什么是")
    assert any(g.size > 1 for g in groups)  # SmolLM2 splits some of them: the case this grouping is for
    cells = token_cells(tokenizer, ids, [])
    first = [c for c in cells if c.group.start == 0]
    assert len(first) == 2 and tokenizer.decode(ids[:1]).endswith(REPLACEMENT)
    assert [position_label(c) for c in first] == ["解¹⁄₂", "解²⁄₂"]


@settings(max_examples=60, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("解释什么是大语言模型注意力鬱龘 aZ,.\n") + ["😀", "🧬", "é", "ü", "€"]),
        min_size=1,
        max_size=24,
    )
)
def test_any_mixed_text_groups_exactly(tokenizer, text):
    check_grouping(tokenizer, tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("text", ["解", "🧬", "a鬱", "😀😀"])
def test_a_run_stopped_mid_character_shows_bytes_not_u_fffd(any_tokenizer, text):
    ids = any_tokenizer.encode(text, add_special_tokens=False)
    last = text[-1].encode("utf-8")
    checked = 0
    for stop in range(1, len(ids)):
        if not any_tokenizer.decode(ids[:stop]).endswith(REPLACEMENT):
            continue  # this prefix ends on a whole character
        checked += 1
        cells = token_cells(any_tokenizer, ids[:1], ids[1:stop])
        tail = cells[-1]
        assert not tail.group.whole and tail.group.stop == stop
        shown = bytes.fromhex(re.sub(r"\s", "", tail.group.text.strip("⟨⟩")))
        assert last.startswith(shown) and 0 < len(shown) < len(last)  # the unfinished character's first bytes
        assert shown == bytes.fromhex("".join(c.bytes_hex.replace(" ", "") for c in cells[tail.group.start :]))
        assert not any(REPLACEMENT in reads_as(c) or REPLACEMENT in position_label(c) for c in cells)
        assert reads_as(cells[-1]).startswith("⟨")  # the newest token: its bytes, the truth of that step
        assert [c.token_id for c in cells] == ids[:stop]
    if not text.isascii() and any(ord(ch) > 0xFFFF for ch in text):
        assert checked  # every tokenizer here splits these emoji: the case was met


def test_a_stray_byte_is_shown_as_bytes_and_does_not_swallow_the_text_after_it(tokenizer):
    piece = tokenizer.encode("解", add_special_tokens=False)
    assert len(piece) == 2  # e8 a7, then a3
    ids = [piece[1]] + tokenizer.encode(" ok 是", add_special_tokens=False)
    cells = token_cells(tokenizer, ids, [])
    assert cells[0].group.size == 1 and not cells[0].group.whole and reads_as(cells[0]).startswith("⟨")
    assert "".join(g.text for g in groups_of(cells)[1:]) == tokenizer.decode(ids[1:]) == " ok 是"


def test_a_candidate_that_finishes_a_character_reads_as_that_character(tokenizer):
    first, second = tokenizer.encode("解", add_special_tokens=False)
    context = tokenizer.encode("说明", add_special_tokens=False) + [first]
    other = tokenizer.encode(" the", add_special_tokens=False)[0]
    finishing, unrelated, fresh = candidate_cells(tokenizer, context, [second, other, first])
    assert tokenizer.decode(context + [second]).endswith("解")
    assert finishing.group.whole and finishing.group.text == "解" and finishing.position == len(context)
    assert position_label(finishing) == "解²⁄₂"
    assert reads_as(unrelated) == tokenizer.decode([other])  # the context's bytes stay unfinished: its own text
    assert reads_as(fresh).startswith("⟨") and REPLACEMENT not in reads_as(fresh)
    whole_context = tokenizer.encode("说明", add_special_tokens=False)
    assert reads_as(candidate_cells(tokenizer, whole_context, [second])[0]).startswith("⟨")  # a stray byte: bytes


def test_the_stream_draws_one_chip_per_character_and_keeps_every_token(tokenizer):
    ids = tokenizer.encode("解释什么是Transformer", add_special_tokens=False)
    cells = token_cells(tokenizer, ids[:-2], ids[-2:])
    body = token_stream_html(cells, inputs=range(len(ids) - 2, len(ids) - 1)).split("</style>")[1]
    chars = re.findall(r'<span class="kv-char">([^<]*)</span>', body)
    assert chars == [g.text for g in groups_of(cells) if g.size > 1]
    assert set("解释什么") <= set(chars)
    assert body.count('class="kv-token') == len(ids)  # every position still has its own element, id and bytes
    assert all(f"id {i} " in body for i in ids)
    assert "⟨" not in body and REPLACEMENT not in body
    assert splits_characters(cells) and not splits_characters(token_cells(tokenizer, tokenizer.encode("hi"), []))


def test_the_apps_candidates_show_characters_and_bytes_never_u_fffd(embedded_model, tokenizer):
    """Step 2 of the article's prompt: the model had just written the first bytes of a character (greedy), so
    the candidates that would finish it read as that character; each label checked against the tokenizer."""
    import engine
    from tests.app_helpers import assert_clean, start
    from ui.text import strings

    generation = engine.Generation(embedded_model, "解释什么是Transformer", chat=False)
    first = generation.prefill().token_id
    assert tokenizer.decode([first]).endswith(REPLACEMENT)  # the case this test is about
    at = start(prompt="解释什么是Transformer", chat=0, step=2, lang="zh", model="embedded")  # SmolLM2: byte tokens
    assert_clean(at)
    words = strings.figure_words("zh")
    frame = next(e.value for e in at.dataframe if words["cand_drawn"] in e.value.columns)
    labels, ids = frame[words["cand_token"]], frame[words["cand_id"]]
    assert not any(REPLACEMENT in label for label in labels)
    finishing = 0
    for label, token_id in zip(labels, ids.astype(int)):
        together = tokenizer.decode([first, token_id])
        if label.endswith("²⁄₂"):
            finishing += 1
            assert REPLACEMENT not in together and label == together.replace(" ", "·") + "²⁄₂"
        else:
            assert REPLACEMENT in together and label.startswith("⟨") == (REPLACEMENT in tokenizer.decode([token_id]))
    assert finishing


def hovers(body: str) -> list[str]:
    """The hover texts (title attributes) of a token stream's HTML, unescaped."""
    import html

    return [html.unescape(t) for t in re.findall(r'title="([^"]*)"', body)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_hover_text_shows_the_character_its_ids_and_bytes_in_the_pages_language(tokenizer, lang):
    """Issue 18: the hover showed the tokenizer's byte-level pieces ('æĺ¯' for 是) and English labels on a
    Chinese page. Each expectation here comes from the tokenizer and UTF-8, not from the hover code."""
    from ui.text import strings

    text = "解释什么是Transformer"
    ids = tokenizer.encode(text, add_special_tokens=False)
    cells = token_cells(tokenizer, ids, [])
    body = token_stream_html(cells, words=strings.figure_words(lang)).split("</style>")[1]
    tips = hovers(body)
    pieces = {tokenizer.convert_ids_to_tokens(i) for i in ids} - {"Trans", "former"}  # byte-level, not text
    assert pieces and not [tip for tip in tips if any(piece in tip for piece in pieces)]
    shi = tokenizer.encode("是", add_special_tokens=False)
    assert len(shi) == 1  # 是 is one token of its own here: its chip's hover names it, its id and its bytes
    tip = next(tip for tip in tips if f" {shi[0]} " in tip)
    assert "“是”" in tip and "e6 98 af" in tip  # 是 is U+662F: UTF-8 e6 98 af
    jie = "解".encode()  # 解 is two tokens (e8 a7, then a3): the group's hover lists both, each with its bytes
    group_tip = next(tip for tip in tips if tip.startswith("“解”"))
    assert "e8 a7" in group_tip and "a3" in group_tip and jie.hex(" ") == "e8 a7 a3"
    assert all(f" {i} " in group_tip for i in ids[:2])
    english = {"position", "bytes", "tokens"}
    found = {word for tip in tips for word in english if re.search(rf"\b{word}\b", tip)}
    assert found == (english if lang == "en" else set()), found
