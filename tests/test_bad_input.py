"""The bad-input catalogue (docs/hosting.md, "Bad input"): every case shows a clear message, never a traceback,
and the page keeps working afterwards."""

from urllib.parse import parse_qs  # as Streamlit decodes a page's link

import pytest

import engine
import ui.page.main
from tests.app_helpers import assert_clean, keeps_working, shown_text, start, step_of
from ui.text import safe, strings


def messages(at) -> list[str]:
    return [w.value for w in at.warning] + [e.value for e in at.error]


# -- links ------------------------------------------------------------------------------------

LINK_CASES = [
    ({"step": "abc"}, "step", "reason_bad_number"),
    ({"step": "-1"}, "step", "reason_out_of_range"),
    ({"step": "1e9"}, "step", "reason_bad_number"),
    ({"temperature": "nan"}, "temperature", "reason_bad_number"),
    ({"temperature": "-1"}, "temperature", "reason_out_of_range"),
    ({"top_p": "0"}, "top_p", "reason_out_of_range"),
    ({"top_p": "5"}, "top_p", "reason_out_of_range"),
    ({"top_k": "-5"}, "top_k", "reason_out_of_range"),
    ({"top_k": "many"}, "top_k", "reason_bad_number"),
    ({"seed": "-1"}, "seed", "reason_out_of_range"),
    ({"seed": str(2**70)}, "seed", "reason_out_of_range"),
    ({"temperature": "1e-38", "step": "3"}, "temperature", "reason_below_floor"),
    ({"block_size": "0"}, "block_size", "reason_out_of_range"),
    ({"block_size": "-3"}, "block_size", "reason_out_of_range"),
    ({"kv_splits": "0"}, "kv_splits", "reason_out_of_range"),
    ({"kv_splits": "999"}, "kv_splits", "reason_out_of_range"),
    ({"layer": "999", "step": "1"}, "layer", "reason_out_of_range"),
    ({"head": "-1"}, "head", "reason_out_of_range"),
    ({"view": "bogus"}, "view", "reason_unknown_choice"),
    ({"lang": "fr"}, "lang", "reason_unknown_choice"),
    ({"chat": "yes"}, "chat", "reason_bad_flag"),
    ({"policy": "lru"}, "policy", "reason_unknown_choice"),
    ({"large": "2"}, "large", "reason_bad_flag"),
    ({"model": "no-such/model"}, "model", "reason_model_not_allowed"),
    ({"model": "/etc"}, "model", "reason_model_not_allowed"),
    ({"model": "../../etc/passwd"}, "model", "reason_model_not_allowed"),
    ({"prompt": "hi\x00\x07 there"}, "prompt", "reason_control_chars"),
    # `abc%ED%A0%80def` (invalid UTF-8: an encoded lone surrogate) as the server decodes a link: "abc���def"
    ({"prompt": parse_qs("prompt=abc%ED%A0%80def")["prompt"][0]}, "prompt", "reason_invalid_text"),
]


@pytest.mark.parametrize(
    "params, param, reason", LINK_CASES, ids=[f"{c[1]}={list(c[0].values())[0]!r}" for c in LINK_CASES]
)
def test_malformed_link_value(params, param, reason, embedded_model):
    at = start(**params)
    assert not at.exception, at.exception
    assert any(f"“{safe.text(param)}=" in w.value and strings.t(reason) in w.value for w in at.warning), messages(at)
    keeps_working(at)


def test_tiny_temperature_in_a_link_samples_instead_of_failing(embedded_model):
    at = start(temperature="1e-38", step=3)  # once every step failed with NaN probabilities
    assert_clean(at)
    assert step_of(at) == 3 and at.slider(key="w_temperature").value == 0.01
    keeps_working(at)


def test_step_past_the_end_of_the_run(embedded_model):
    at = start(prompt="Say OK.", step=200)
    assert not at.exception
    assert any("cannot be shown" in m for m in messages(at)), messages(at)
    at.button(key="b_back").click().run()
    assert not at.exception and step_of(at) >= 1


def test_huge_prompt_in_a_link(embedded_model):
    at = start(prompt="word " * 2000)
    assert not at.exception
    assert any(strings.t("reason_too_long") in m for m in messages(at))
    assert any("at most 384" in m for m in messages(at))


# -- typed input ------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt, expected", [("", "empty"), ("   \n\t ", "empty"), ("word " * 700, "at most 384")])
def test_unusable_prompt_typed(prompt, expected, embedded_model):
    at = start(step=1)
    at.text_area(key="w_prompt").set_value(prompt).run()
    assert not at.exception
    assert any(expected in e.value for e in at.error), messages(at)
    at.text_area(key="w_prompt").set_value("What is a KV cache?").run()
    keeps_working(at)


def test_control_characters_typed(embedded_model):
    at = start()
    at.text_area(key="w_prompt").set_value("bell\x07 and null\x00 here").run()
    assert not at.exception
    assert any(strings.t("reason_control_chars") in w.value for w in at.warning)
    keeps_working(at)
    assert "bell and null here" in shown_text(at)


def test_invalid_utf8_in_a_link_is_removed_with_a_message(embedded_model):
    at = start(prompt=parse_qs("prompt=abc%ED%A0%80def")["prompt"][0], chat=0, step=1)
    assert any(strings.t("reason_invalid_text") in w.value and "“abcdef”" in w.value for w in at.warning), messages(at)
    assert shown_text(at).startswith("abcdef") and "\ufffd" not in shown_text(at)
    keeps_working(at)


def test_replacement_characters_typed(embedded_model):
    at = start()  # a widget's value cannot carry a lone surrogate (protobuf strings are UTF-8): test_state checks it
    at.text_area(key="w_prompt").set_value("pasted \ufffd\ufffd bytes").run()
    assert not at.exception
    assert any(strings.t("reason_invalid_text") in w.value for w in at.warning), messages(at)
    keeps_working(at)


@pytest.mark.parametrize("prompt", ["مرحبا، ما هي ذاكرة KV؟", "שלום עולם", "解释什么是Transformer 🤖🚀👩‍👩‍👧"])
def test_right_to_left_emoji_and_cjk_prompts_work_exactly(prompt, embedded_model):
    at = start(prompt=prompt, chat=0, step=3)
    assert not at.exception and not at.error
    assert shown_text(at).startswith(prompt)
    keeps_working(at)


# -- models -----------------------------------------------------------------------------------


def test_unreachable_hub_model(monkeypatch, embedded_model):
    monkeypatch.setenv("KVSCOPE_ALLOW_ANY_MODEL", "1")
    at = start(model="some-org/not-reachable-here")
    assert not at.exception
    assert any("could not be loaded" in e.value for e in at.error), messages(at)
    at.button(key="use_default").click().run()
    assert not at.exception and not at.error
    keeps_working(at)


def test_model_that_fails_to_load_for_lack_of_memory(monkeypatch, embedded_model, tiny_model_dir):
    folder = tiny_model_dir("qwen3")
    real = engine.load_model

    def out_of_memory(spec, *args, **kwargs):
        if spec == folder:
            raise MemoryError()
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(engine, "load_model", out_of_memory)
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    ui.page.main.read_model.clear()  # another test of this process may have loaded the folder: load it again
    ui.page.main.load_model.clear()
    at = start(model=folder)
    assert not at.exception
    assert any("MemoryError" in e.value for e in at.error), messages(at)
    at.button(key="use_default").click().run()
    keeps_working(at)


def test_allowed_local_model_loads(monkeypatch, tiny_model_dir):
    folder = tiny_model_dir("gpt2")
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    at = start(model=folder, chat=0, step=2)
    assert not at.exception and not at.error
    keeps_working(at)


# -- faults -----------------------------------------------------------------------------------


def test_exception_inside_a_step_is_shown_and_the_session_can_restart(monkeypatch, embedded_model):
    at = start(prompt="A fault is injected into step two of this run", step=1)  # its own run: step 2 is computed
    real_step = engine.Generation.step

    def broken(self):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(engine.Generation, "step", broken)
    at.button(key="b_next").click().run()
    assert not at.exception
    assert any("injected fault" in e.value for e in at.error), messages(at)
    monkeypatch.setattr(engine.Generation, "step", real_step)
    at.button(key="b_reset_session").click().run()
    assert not at.exception and not at.error and step_of(at) == 0
    keeps_working(at)
    keeps_working(at)


# -- isolation --------------------------------------------------------------------------------


def published_then_reused(monkeypatch, shared: str) -> int:
    """Student A prefills a prompt and moves on (publishing it); student B then prefills its extension."""
    monkeypatch.setenv("KVSCOPE_SHARED_PREFIX_CACHE", shared)
    base = f"Classroom prompt {shared}: explain the KV cache in one line"
    a = start(prompt=base, chat=0, step=1, view="prefix", policy="radix")
    a.text_area(key="w_prompt").set_value("something else entirely").run()  # A's old prompt is published
    b = start(prompt=base + " please", chat=0, step=1, view="prefix", policy="radix")
    assert not b.exception and not b.error
    return int({m.label: m.value for m in b.metric}[strings.t("reused")])


def test_sessions_share_nothing_unless_the_host_turns_on_the_classroom_cache(monkeypatch, embedded_model):
    assert published_then_reused(monkeypatch, "0") == 0
    assert published_then_reused(monkeypatch, "1") > 0
