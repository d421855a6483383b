"""The class answers' rules (ui/follow/class_answers.py) and their store (ui/follow/store.py, ui/follow/sync.py): a
guess as the token the model would read, one answer per browser, the counts in the link, the reveal's numbers against
the sampler's own on both embedded models, and answers that outlive a paused and a restarted redis-server."""

import os
import signal

import pytest
import torch

import engine
from engine.sampler import Sampling, candidates, filter_logits
from tests.redis_server import redis_process
from tests.test_room_sync import settles
from ui.follow import class_answers
from ui.follow.class_answers import (
    answers_key,
    checked_guess,
    counts_of,
    guess_token,
    ids_of,
    reveal,
    spaced,
    tally_of,
    tally_text,
)
from ui.follow.class_prompts import PromptRefused
from ui.follow.rooms import Rooms
from ui.follow.store import RedisStore
from ui.follow.sync import RoomSync
from ui.state.link import parse_query


@pytest.mark.parametrize(
    "guess, before, expected",
    [
        ("Paris", "The capital of France is", " Paris"),  # the next word gets its space
        ("42", "The answer is", " 42"),
        ("Paris", "is ", "Paris"),  # after a space, as typed
        (" Paris", "is", " Paris"),  # a space typed is kept
        (",", "Hello", ","),  # punctuation joins
        ("quote", "he said “", "quote"),  # after an opening quote
        ("Paris", "", "Paris"),
        ("巴黎", "法国的首都是", "巴黎"),  # unspaced scripts
        ("Paris", "首都是", "Paris"),
        ("Hello", "assistant\n", "Hello"),  # a chat answer's first word
    ],
)
def test_a_guess_is_read_as_the_next_word(guess, before, expected):
    assert spaced(guess, before) == expected


@pytest.mark.parametrize("model_name", ["embedded", "embedded-zh"])
def test_a_guess_becomes_the_token_the_model_reads_next_in_context(model_name, request):
    model = request.getfixturevalue("embedded_model" if model_name == "embedded" else "embedded_zh_model")
    tokenizer = model.tokenizer
    cases = {
        "embedded": [
            ("The capital of France is", "Paris"),
            ("I like", "cats and dogs"),
            ("Hello", ","),
            ("1 + 1 =", "2"),
        ],
        "embedded-zh": [("法国的首都是", "巴黎"), ("我最喜欢的动物是", "猫"), ("The capital of France is", "Paris")],
    }
    for before, guess in cases[model_name]:
        context = tokenizer.encode(before, add_special_tokens=False)
        whole = tokenizer.encode(before + spaced(guess, before), add_special_tokens=False)
        assert whole[: len(context)] == context, "a case whose guess joins the context's last token tests nothing here"
        token = guess_token(tokenizer, context[-1], before, guess)
        assert token == whole[len(context)], (before, guess, tokenizer.decode([token]))
    # Where the text would join the context's last token ("是" + "一种" is one token of Gemma's, "是一种"), the
    # context's tokens are the run's and stay: the guess is the token it starts with on its own
    joins = {"embedded": ("The cat", "s"), "embedded-zh": ("KV 缓存是", "一种")}[model_name]
    context = tokenizer.encode(joins[0], add_special_tokens=False)
    alone = tokenizer.encode(spaced(joins[1], joins[0]), add_special_tokens=False)
    assert guess_token(tokenizer, context[-1], *joins) == alone[0]


def test_a_guess_that_is_not_plain_text_is_refused(embedded_model):
    specials = engine.prompt.control_texts(embedded_model.tokenizer)
    for text, reason in [
        ("", "empty"),
        ("   ", "empty"),
        ("x" * 41, "too_long"),
        ("a\x00b", "control_chars"),
        ("a\u200bb", "control_chars"),
        ("<|im_start|>", "control_token"),
        ("<b>hi</b>", "markup"),
    ]:
        with pytest.raises(PromptRefused) as refused:
            checked_guess(text, specials)
        assert refused.value.reason == reason, text
    assert checked_guess(" Paris  ", specials) == " Paris"  # a leading space says "a new word"


def test_answers_count_once_per_browser_and_travel_in_the_link_as_counts():
    answers = {"browser-a": "12", "browser-b": "40", "browser-c": "12", "junk": "not a token"}
    counts = counts_of(answers)
    assert counts == {12: 2, 40: 1} and list(counts) == [12, 40]
    assert tally_of(tally_text(counts)) == counts
    state, problems = parse_query({"ask": "7", "ask_phase": "shown", "ask_tally": tally_text(counts), "ask_hide": "40"})
    assert (state.ask, state.ask_phase, tally_of(state.ask_tally), ids_of(state.ask_hide)) == (
        7,
        "shown",
        counts,
        frozenset({40}),
    ) and not problems
    for bad in ("12:a", "<b>:1", "12:2;40:1", "1" * 8 + ":1"):
        state, problems = parse_query({"ask_tally": bad})
        assert state.ask_tally == "" and [p.reason for p in problems] == ["bad_list"], bad
    state, problems = parse_query({"ask_phase": "revealed-by-a-student"})
    assert state.ask_phase == "open" and problems
    assert answers_key("code", 3) != answers_key("code", 4) != answers_key("other", 3)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=20, top_p=0.9, seed=3)])
def test_the_reveal_reads_the_samplers_probabilities_and_says_the_round_right(sampling):
    torch.manual_seed(0)
    logits = torch.randn(300)
    stages = filter_logits(logits, sampling)
    sampler = {c.token_id: c.p_top_p for c in candidates(stages, _Tokens(), drawn=int(logits.argmax()), count=300)}
    picked = int(logits.argmax())
    second = max((t for t in sampler if t != picked), key=sampler.get)
    far = min(sampler, key=sampler.get)
    assert sampler[second] > 0 and (sampling.greedy or sampler[far] == 0)  # a token the filters took out: 0
    counts = {second: 4, picked: 3, far: 1}
    shown = reveal(logits, sampling, picked, counts, frozenset({far}))
    assert (shown.answered, shown.right, shown.picked) == (8, 3, picked)
    for bar in shown.bars + shown.guesses:
        assert bar.probability == pytest.approx(sampler[bar.token_id], rel=1e-6, abs=1e-12)
        assert bar.count == counts.get(bar.token_id, 0) and bar.picked == (bar.token_id == picked)
    model_top = sorted((t for t in sampler if sampler[t] > 0), key=lambda t: -sampler[t])[: class_answers.MODEL_TOP]
    assert [b.token_id for b in shown.bars if b.top is not None] == model_top  # the model's own, most likely first
    assert {b.token_id for b in shown.guesses} == set(counts) and [b for b in shown.bars if b.hidden][0].token_id == far
    assert shown.sentence == ("ask_favourite", {"k": 3, "n": 8, "favourites": (shown.guesses[0],)})
    assert shown.guesses[0].token_id == second
    tie = reveal(logits, sampling, picked, {second: 2, picked: 2}, frozenset())
    assert tie.sentence[0] == "ask_favourites" and {b.token_id for b in tie.favourites} == {second, picked}
    wide = reveal(logits, sampling, picked, {t: 1 for t in list(sampler)[:6]}, frozenset())
    assert wide.sentence == ("ask_no_favourite", {"k": int(picked in list(sampler)[:6]), "n": 6, "tied": 6})
    assert reveal(logits, sampling, picked, {}, frozenset()).sentence == ("ask_nobody", {})


class _Tokens:
    """A tokenizer for `candidates`' labels: the probabilities are what the test reads."""

    def convert_ids_to_tokens(self, token_id):
        return str(token_id)

    def decode(self, ids):
        return str(ids[0])


def test_a_map_field_per_browser_in_either_store(store):
    store.put_field("answers", "browser-a", "12", 60)
    store.put_field("answers", "browser-b", "40", 60)
    store.put_field("answers", "browser-a", "41", 60)  # a reload's answer replaces the browser's first
    assert store.fields("answers") == {"browser-a": "41", "browser-b": "40"}
    assert store.fields("nothing") == {}


def test_answers_given_while_redis_is_paused_then_restarted_empty_are_all_counted_once(tmp_path):
    expected = {200: 10, 100: 2, 101: 2, 102: 1}
    with redis_process(tmp_path) as (url, process):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        room_sync, key = RoomSync(Rooms(RedisStore(url))), answers_key("room", 5)
        try:
            for browser in range(10):
                room_sync.answer(key, f"browser-{browser}", str(100 + browser % 3))
            room_sync.tally(key)  # read from now on, as the teacher's page asks for it
            assert settles(room_sync) and len(room_sync.tally(key)) == 10
            os.kill(process.pid, signal.SIGSTOP)
            try:
                for browser in range(5, 15):  # five change their answer, five more answer, while Redis is paused
                    room_sync.answer(key, f"browser-{browser}", "200")
                assert settles(room_sync) and room_sync.error is not None
                assert not room_sync.sent(key, "browser-14")
            finally:
                os.kill(process.pid, signal.SIGCONT)
            assert settles(room_sync) and settles(room_sync) and room_sync.sent(key, "browser-14")
            assert counts_of(RedisStore(url).fields(key)) == expected
            process.terminate()  # stopped: everything it held is gone
            process.wait()
            assert settles(room_sync) and room_sync.error is not None
            with redis_process(tmp_path, port=port):  # started again, empty: nothing saved
                for _ in range(40):  # a harness bound: the answers come back within a round or two
                    if counts_of(RedisStore(url).fields(key)) == expected:
                        break
                    assert settles(room_sync)
                assert counts_of(RedisStore(url).fields(key)) == expected
                assert len(RedisStore(url).fields(key)) == 15  # every browser once
                assert room_sync.tally(key) is not None and settles(room_sync) and len(room_sync.tally(key)) == 15
        finally:
            room_sync.close()
