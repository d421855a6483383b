"""Link parsing: every value either round-trips or falls back with a stated problem."""

from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from ui.host.limits import load_limits
from ui.state.link import AppState, clamp, clean_prompt, default_prompt, link_holds, parse_query, to_query


def test_default_state_round_trips_through_a_link():
    state = AppState(
        prompt="解释什么是Transformer 🤖",
        chat=False,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        seed=3,
        block_size=4,
        kv_splits=5,
        policy="whole",
        step=12,
        view="prefix",
        layer=3,
        head=7,
        lang="zh",
        large=True,
    )
    parsed, problems = parse_query(to_query(state))
    assert parsed == state and problems == []
    assert to_query(AppState()) == {"step": "0"}


@pytest.mark.parametrize(
    "param, raw, fallback, reason",
    [
        ("step", "abc", 0, "bad_number"),
        ("step", "-4", 0, "out_of_range"),
        ("step", "2.5", 0, "bad_number"),
        ("temperature", "nan", 0.0, "bad_number"),
        ("temperature", "inf", 0.0, "bad_number"),
        ("temperature", "-1", 0.0, "out_of_range"),
        ("temperature", "99", 5.0, "out_of_range"),
        ("temperature", "1e-38", 0.01, "below_floor"),
        ("temperature", "0.009", 0.01, "below_floor"),
        ("seed", str(2**70), 2**31 - 1, "out_of_range"),
        ("top_p", "0", 0.01, "out_of_range"),
        ("top_p", "1.5", 1.0, "out_of_range"),
        ("top_k", "-5", 0, "out_of_range"),
        ("seed", "1e99", 0, "bad_number"),
        ("block_size", "0", 1, "out_of_range"),
        ("block_size", "4096", 256, "out_of_range"),
        ("kv_splits", "0", 1, "out_of_range"),
        ("kv_splits", "1000", 64, "out_of_range"),
        ("layer", "x", 0, "bad_number"),
        ("head", "-1", 0, "out_of_range"),
        ("view", "bogus", "flow", "unknown_choice"),
        ("lang", "fr", "en", "unknown_choice"),
        ("policy", "lru", "block", "unknown_choice"),
        ("chat", "yes", True, "bad_flag"),
        ("large", "2", False, "bad_flag"),
    ],
)
def test_malformed_values_fall_back_with_a_problem(param, raw, fallback, reason):
    state, problems = parse_query({param: raw})
    assert getattr(state, param) == fallback
    assert [(p.param, p.reason) for p in problems] == [(param, reason)]


@settings(max_examples=300, deadline=None)
@given(
    temperature=st.floats(allow_nan=True, allow_infinity=True),
    top_p=st.floats(),
    top_k=st.integers(),
    seed=st.integers(-(2**80), 2**80),
)
def test_every_sampling_setting_a_link_yields_is_one_the_engine_accepts(temperature, top_p, top_k, seed):
    state, _ = parse_query(
        {"temperature": repr(temperature), "top_p": repr(top_p), "top_k": str(top_k), "seed": str(seed)}
    )
    engine.Sampling(temperature=state.temperature, top_k=state.top_k, top_p=state.top_p, seed=state.seed)


def test_a_zero_temperature_stays_greedy_and_the_floor_is_kept():
    assert parse_query({"temperature": "0"}) == (AppState(temperature=0.0), [])
    assert parse_query({"temperature": "0.01"}) == (AppState(temperature=0.01), [])


def test_prompt_loses_control_characters_and_is_bounded():
    state, problems = parse_query({"prompt": "hi\x00\x1b[31m there\x7f"})
    assert state.prompt == "hi[31m there" and problems[0].reason == "control_chars"
    family = "👩\u200d👩\u200d👧 \u202eright-to-left override"  # joiners and direction marks are text, kept
    assert parse_query({"prompt": family}) == (AppState(prompt=family), [])
    state, problems = parse_query({"prompt": "x" * 5000})
    assert len(state.prompt) == 4000 and problems[0].reason == "too_long"
    state, problems = parse_query({"prompt": "مرحبا 你好 👋\nline two\tTab"})
    assert state.prompt == "مرحبا 你好 👋\nline two\tTab" and problems == []


def test_bytes_that_are_not_text_are_removed_and_named():
    from streamlit.runtime.state.query_params import _parse_query_string  # how the server decodes a page's link

    linked = _parse_query_string("prompt=abc%ED%A0%80def")["prompt"][-1]  # a UTF-8-encoded lone surrogate
    assert linked == "abc\ufffd\ufffd\ufffddef"  # what the model would read, were it not cleaned
    state, problems = parse_query({"prompt": linked})
    assert state.prompt == "abcdef" and [p.reason for p in problems] == ["invalid_text"]
    assert clean_prompt("lone \ud800 surrogate") == ("lone  surrogate", ("invalid_text",))
    assert clean_prompt("bell\x07 and \ufffd") == ("bell and ", ("control_chars", "invalid_text"))
    assert clean_prompt("\ufffd" + "x" * 5000) == ("x" * 4000, ("invalid_text", "too_long"))


def test_layer_and_head_are_fitted_to_the_model():
    state, problems = clamp(AppState(layer=40, head=3), layers=30, heads=9)
    assert (state.layer, state.head) == (29, 3) and [p.param for p in problems] == ["layer"]


def test_host_limits_come_from_the_environment():
    limits = load_limits(
        {
            "KVSCOPE_MODELS": "Qwen/Qwen3-0.6B, embedded",
            "KVSCOPE_MAX_NEW_TOKENS": "32",
            "KVSCOPE_MAX_PROMPT_TOKENS": "oops",
        }
    )
    assert limits.models == ("embedded", "embedded-zh", "Qwen/Qwen3-0.6B")  # both embedded models always
    assert limits.max_new_tokens == 32 and limits.max_prompt_tokens == 384
    assert limits.model_allowed("Qwen/Qwen3-0.6B") and not limits.model_allowed("/etc")
    assert load_limits({"KVSCOPE_ALLOW_ANY_MODEL": "1"}).model_allowed("/some/folder")


def test_a_setting_in_seconds_is_clamped_and_a_bad_one_is_the_default():
    """The follower's poll and the leader's heartbeat are read so too (ui/follow): a typo in a host's secrets
    must not stop the app from starting, nor a 0 make a page poll without pause."""
    from ui.host.limits import env_seconds

    assert env_seconds({"S": "2.5"}, "S", 3.0, 0.1, 10.0) == 2.5
    assert env_seconds({"S": "0"}, "S", 3.0, 0.1, 10.0) == 0.1 and env_seconds({"S": "-4"}, "S", 3.0, 0.1, 10.0) == 0.1
    assert env_seconds({"S": "99"}, "S", 3.0, 0.1, 10.0) == 10.0
    assert env_seconds({"S": "three"}, "S", 3.0, 0.1, 10.0) == 3.0
    assert env_seconds({"S": ""}, "S", 3.0, 0.1, 10.0) == env_seconds({}, "S", 3.0, 0.1, 10.0) == 3.0
    assert load_limits({"KVSCOPE_MIN_PACE": "0.01"}).min_pace == 0.05
    assert load_limits({"KVSCOPE_MIN_PACE": "fast"}).min_pace == 0.3


def test_a_page_in_chinese_opens_on_the_chinese_model_with_its_base_model_prompt():
    """lang=zh alone: Gemma 3 270M (embedded-zh), chat off (a base model has no template), a prompt to go on from;
    none of them is written into the link, and naming another model keeps it."""
    state, problems = parse_query({"lang": "zh"})
    assert not problems
    assert (state.model, state.chat, state.prompt) == ("embedded-zh", False, "什么是 KV 缓存？KV 缓存是")
    assert to_query(state) == {"lang": "zh", "step": "0"}
    english = parse_query({"lang": "zh", "model": "embedded", "chat": "1"})[0]
    assert (english.model, english.chat) == ("embedded", True)
    assert parse_query(to_query(english))[0] == english
    assert parse_query({})[0].model == "embedded"


def test_the_view_registry_lists_every_view_once_with_its_module_and_labels():
    """`ui.views.MODULES` is the one list of views: each name draws through its module's `render`, has a label in
    both languages, and every view module under ui/views/ is listed (the stepper is part of every view)."""
    import importlib
    from pathlib import Path

    from ui import views
    from ui.state.link import LANGS, VIEWS
    from ui.text import strings

    assert VIEWS == tuple(views.MODULES) and len(set(views.MODULES.values())) == len(VIEWS)
    for name, module in views.MODULES.items():
        assert callable(importlib.import_module(f"ui.views.{module}").render), name
        for lang in LANGS:
            assert strings.STRINGS[lang].get("view_" + name), (name, lang)
    folder = Path(views.__file__).parent
    drawing = {path.stem for path in folder.glob("*.py") if "\ndef render(" in path.read_text(encoding="utf-8")}
    assert drawing - {"__init__", "stepper"} == set(views.MODULES.values())


def test_a_link_holds_what_it_writes_and_the_languages_defaults_it_leaves_out():
    """`link_holds` reads a value as `to_query` wrote it: a parameter left out is the default of the link's own
    language (its prompt and model), an empty prompt is itself, a switch is 1 or 0."""
    english, chinese = {"step": "2"}, {"step": "2", "lang": "zh"}
    assert link_holds(english, "block_size", 16) and not link_holds(english, "block_size", 4)
    assert link_holds(english, "prompt", default_prompt("en")) and not link_holds(english, "prompt", "")
    assert link_holds(chinese, "prompt", default_prompt("zh")) and link_holds(chinese, "model", "embedded-zh")
    assert link_holds({"prompt": ""}, "prompt", "") and not link_holds({"prompt": ""}, "prompt", default_prompt("en"))
    assert link_holds({"chat": "0"}, "chat", False) and link_holds({"block_size": "4"}, "block_size", 4)
    for state in (AppState(block_size=4, chat=False, prompt=""), AppState(lang="zh", model="embedded", step=3)):
        written = to_query(state)
        assert all(link_holds(written, f.name, getattr(state, f.name)) for f in fields(AppState) if f.name != "step")
