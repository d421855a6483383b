"""The page's strings (ui/text/strings.csv, viz/figure_words.csv, ui/lesson/lesson.toml): every one in every
language, so a Chinese page never falls back to English, and English counts that can be 1 read "1 token", never
"1 tokens"."""

import re
import string

import pytest

from ui.lesson.chapters import CHAPTERS, TEXT_PARTS
from ui.text import strings
from viz.words import LANGUAGES, TRANSLATIONS, read_words

SINGULAR = strings.SINGULAR  # an English-only variant of a string, for a count of 1
ENGLISH, OTHERS = strings.STRINGS[LANGUAGES[0]], [strings.STRINGS[lang] for lang in LANGUAGES[1:]]
# "1 tokens", "1 positions": a count of one before a plural noun
ONE_PLURAL = re.compile(
    r"(?<![\d.,])1 (tokens|positions|ids|steps|blocks|splits|layers|heads"
    r"|prompt tokens|prompt ids)\b"
)


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_key_has_every_language_with_the_same_placeholders():
    """A key a language lacks would show English on that page (`t` falls back to English). Only English's
    singular variants ("1 token") may stand alone, beside their plural key; figure words have them translated."""
    singular = {key for key in ENGLISH if key.endswith(SINGULAR) and not key.startswith("fig_")}
    assert len(OTHERS) == len(LANGUAGES) - 1 >= 1
    for table in OTHERS:
        assert set(table) == set(ENGLISH) - singular, set(ENGLISH) ^ set(table)
        for key, text in table.items():
            assert text.strip(), key
            assert placeholders(text) == placeholders(ENGLISH[key]), key


def test_english_singular_variants_belong_to_a_counted_string():
    for key in (k for k in ENGLISH if k.endswith(SINGULAR) and not k.startswith("fig_")):  # viz picks its own
        base = key.removesuffix(SINGULAR)
        assert all(base in table for table in OTHERS), key
        assert "n" in placeholders(ENGLISH[base]), key  # the count is `n`: `t` picks the variant by it
        assert placeholders(ENGLISH[key]) <= placeholders(ENGLISH[base]), key


def test_every_language_has_its_name_in_its_own_words():
    assert set(strings.LANGUAGE_NAMES) == set(LANGUAGES) and strings.LANGUAGE_NAMES["zh"] == "简体中文"


@pytest.mark.parametrize(
    "table, problem",
    [
        ("key,en\nx,y\n", "first line"),  # a language's column missing
        ("key,en,zh\nx,y\n", "line 2"),  # a row short of a language
        ("key,en,zh\nx,y,z\nx,v,w\n", "line 3"),  # a key twice: the later row would silently win
    ],
)
def test_a_table_in_another_shape_is_refused_by_line(tmp_path, table, problem):
    path = tmp_path / "words.csv"
    path.write_text(table, encoding="utf-8")
    with pytest.raises(ValueError, match=problem):
        read_words(path)


def test_t_says_one_token_in_english_and_leaves_chinese_as_it_is():
    assert strings.t("count_tokens", "en", n=1) == "1 token"
    assert strings.t("count_tokens", "en", n=2) == "2 tokens"
    assert strings.t("count_tokens", "en", n=1234) == "1,234 tokens"
    assert strings.t("count_tokens", "zh", n=1) == "1 个 token"


def filled(text: str, count: int) -> str:
    """`text` with every placeholder given `count`."""
    return text.format(**dict.fromkeys(placeholders(text), count))


def test_no_english_string_says_one_tokens():
    """Every English string that counts with `n`, given n = 1 (its other numbers 2), as the page formats it."""
    bad = [
        key
        for key, text in ENGLISH.items()
        if "n" in placeholders(text)
        and not key.endswith(SINGULAR)
        and not key.startswith("fig_")  # figure words: below
        and ONE_PLURAL.search(strings.t(key, "en", **{name: 2 for name in placeholders(text)} | {"n": 1}))
    ]
    assert not bad, bad


# words whose count is never 1: a character drawn as a group is made of two tokens or more; the costs chart times
# engine.timing.TIMED_STEPS decode steps
ALWAYS_SEVERAL = {"tip_group", "decode_per_token"}


@pytest.mark.parametrize(
    "key", [k for k, text in TRANSLATIONS["en"].items() if "{n}" in text and k not in ALWAYS_SEVERAL]
)
def test_no_figure_word_says_one_tokens(key):
    """A viz function picks a `_one` word where there is one; the others must read right with 1."""
    words = TRANSLATIONS["en"]
    text = words.get(key + SINGULAR, words[key])
    assert not ONE_PLURAL.search(filled(text, 1)), (key, text)


# counts a chapter quotes that can be 1 (a one-token prompt, a prefill that found all but one token cached)
COUNTS_THAT_CAN_BE_ONE = ("n", "inputs", "computed", "reused", "n_but_one")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.key)
def test_chapters_never_put_a_count_that_can_be_one_before_a_plural_noun(chapter):
    for part in TEXT_PARTS:
        text = chapter.part(part, "en")
        found = re.findall(
            r"{(" + "|".join(COUNTS_THAT_CAN_BE_ONE) + r")(?:[:!][^}]*)?} (tokens|positions|ids)\b", text
        )
        assert not found, (part, found)  # such a count goes through {n_tokens} and the like ("1 token")


def test_every_chapter_has_chinese_text():
    for chapter in CHAPTERS:
        for part in TEXT_PARTS:
            assert chapter.text["zh"][part].strip() and chapter.text["zh"][part] != chapter.text["en"][part]


def test_the_counts_said_to_be_several_are():
    from engine.timing import TIMED_STEPS

    assert TIMED_STEPS > 1  # decode_per_token's n
