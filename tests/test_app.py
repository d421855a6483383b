"""The Streamlit app, driven headless with AppTest: controls, views, links, bad input."""

import re

import pytest

from engine.prompt import tokenize_prompt
from tests.app_helpers import VIEW_TITLES, assert_clean, shown_text, start
from tests.helpers import expected
from ui.page import step as step_fragment
from ui.runs.serving import ARRIVALS
from ui.runs.speculative import PROMPTS
from ui.state.link import LANGS, REUSE_POLICIES, VIEWS, AppState, parse_query
from ui.text import strings


def test_default_page_shows_the_prompt_ready_to_prefill(embedded_model):
    at = start()
    assert_clean(at)
    assert "What is a KV cache?" in shown_text(at)
    assert at.markdown[0].value.startswith("**Ready to prefill")
    assert at.query_params["step"] == "0"


def test_next_back_prefill_and_reset_step_and_update_the_link(embedded_model):
    at = start()
    at.button(key="b_next").click().run()
    assert_clean(at)
    one = shown_text(at)
    assert at.query_params["step"] == "1" and "Prefill" in at.markdown[0].value
    at.button(key="b_next").click().run()
    two = shown_text(at)
    assert at.query_params["step"] == "2" and len(two) > len(one) and two.startswith(one)
    assert "Decode" in at.markdown[0].value
    at.button(key="b_back").click().run()
    assert at.query_params["step"] == "1" and shown_text(at) == one
    at.button(key="b_reset").click().run()
    assert at.query_params["step"] == "0"
    at.button(key="b_prefill").click().run()
    assert at.query_params["step"] == "1" and shown_text(at) == one


def test_a_press_moves_one_step_when_streamlit_calls_its_callback_twice(monkeypatch, embedded_model):
    """Seen in Chromium on a busy machine, 2 presses in ~450: one press of Next, its callback called twice 55 ms
    apart (the run the first call started was stopped before it drew the step buttons again), and the page went two
    steps on. Here every press's callback is called twice; once the buttons are drawn again, a press moves again."""
    real = step_fragment.move
    monkeypatch.setattr(step_fragment, "move", lambda *args: (real(*args), real(*args)))
    at = start(step=2)  # its buttons call the doubled callback
    for button, step in (("b_next", "3"), ("b_next", "4"), ("b_back", "3"), ("b_reset", "0"), ("b_prefill", "1")):
        at.button(key=button).click().run()
        assert at.query_params["step"] == step, button
    assert_clean(at)


def test_a_link_restores_the_exact_state(embedded_model):
    params = dict(
        prompt="Name three colours.",
        chat=1,
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        seed=5,
        block_size=4,
        kv_splits=3,
        policy="radix",
        step=6,
        view="split",
        layer=2,
        head=1,
        lang="zh",
        model="embedded",
    )
    at = start(**params)  # a Chinese page on SmolLM2 (named: a Chinese page's default is embedded-zh)
    assert_clean(at)
    assert shown_text(at) == expected(
        embedded_model,
        "Name three colours.",
        6,
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        seed=5,
        kv_splits=3,
        block_size=4,
    )
    for key, value in params.items():
        if key != "step":
            assert str(at.session_state["w_" + key]) == str(value) or at.session_state["w_" + key] == value
    assert at.title[0].value == strings.t("title", "zh")
    # The link the page writes back describes the same state (defaults such as chat=1 are left out).
    assert parse_query(dict(at.query_params.items())) == parse_query({k: str(v) for k, v in params.items()})
    assert len(at.dataframe) >= 1  # the split table for layer 2, head 1


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("step", [0, 1, 3])
def test_every_view_renders_before_prefill_after_prefill_and_while_decoding(view, step, embedded_model):
    at = start(view=view, step=step, kv_splits=2, block_size=4)  # the Serving view keeps its own blocks of 16
    assert_clean(at)
    assert parse_query(dict(at.query_params.items()))[0].view == view and at.query_params["step"] == str(step)
    assert strings.t(VIEW_TITLES[view]) in [s.value for s in at.subheader]
    hints = [i.value for i in at.info]
    if step == 0:  # nothing has run: the view says how to start it (the Serving view: its server's first step; the
        start_hint = {  # speculative view: its first pass, the prefill of its own prompt with the draft's guesses)
            "serving": lambda: strings.t("serve_ready", n=ARRIVALS.count(0), total=len(ARRIVALS)),
            "speculate": lambda: strings.t(
                "spec_ready",
                k=AppState().draft_k,
                prompt=len(tokenize_prompt(embedded_model, PROMPTS[("edit", "en", True)], chat=True)),
            ),
        }.get(view, lambda: strings.t("need_prefill"))()
        assert start_hint in hints
    else:  # the step's own figures, and the counter names the step
        assert strings.t("need_prefill") not in hints
        assert len(at.get("plotly_chart")) >= 1
        counter = f"Pass {step}" if view == "speculate" else f"step {step}"  # its step is a verify pass
        assert counter in " ".join(h.value for h in at.get("html"))


def test_views_can_be_switched_and_layer_head_chosen(embedded_model):
    at = start(step=2)
    for view in VIEWS:
        at.radio(key="w_view").set_value(view).run()
        assert_clean(at)
    at.radio(key="w_view").set_value("attention").run()
    at.number_input(key="w_layer").set_value(29).run()
    at.number_input(key="w_head").set_value(8).run()
    assert_clean(at)
    assert at.query_params["layer"] == "29" and at.query_params["head"] == "8"
    at.toggle(key="v_scores").set_value(True).run()
    assert_clean(at)


def test_sidebar_controls_start_a_new_run(embedded_model):
    at = start(step=3)
    greedy = shown_text(at)
    at.slider(key="w_temperature").set_value(1.5).run()
    at.number_input(key="w_seed").set_value(11).run()
    assert_clean(at)
    assert shown_text(at) == expected(embedded_model, "What is a KV cache?", 3, temperature=1.5, seed=11)
    assert shown_text(at) != greedy
    at.toggle(key="w_chat").set_value(False).run()
    assert shown_text(at).startswith("What is a KV cache?")
    at.selectbox(key="w_lang").set_value("zh").run()
    assert at.title[0].value == strings.t("title", "zh")
    at.toggle(key="w_large").set_value(True).run()
    assert_clean(at)
    assert at.query_params["large"] == "1"


def test_a_settings_widget_drawn_anew_sends_back_the_setting_it_shows():
    """A browser that draws a settings widget anew (without the value it held) sends the widget's default back as
    a change: under the load test's 30 pages a page's prompt turned "", and chat, top-p and block size turned to
    off and their minimums, with nobody touching them. Every widget's default must be the page's current setting,
    so that this done to every widget at once leaves the page as it was."""
    at = start(
        prompt="Why is the sky blue?",
        chat=1,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        seed=3,
        block_size=8,
        kv_splits=2,
        policy="radix",
        lang="zh",
        large=1,
        step=2,
        model="embedded",
    )
    assert_clean(at)
    link, text = dict(at.query_params), shown_text(at)
    for key in ("w_chat", "w_large"):
        at.toggle(key=key).set_value(at.toggle(key=key).proto.default)
    for key in ("w_temperature", "w_top_p", "p_pace"):
        at.slider(key=key).set_value(at.slider(key=key).proto.default[0])
    for key in ("w_top_k", "w_seed", "w_block_size", "w_kv_splits"):
        at.number_input(key=key).set_value(at.number_input(key=key).proto.default)
    at.text_area(key="w_prompt").input(at.text_area(key="w_prompt").proto.default)
    models = at.selectbox(key="w_model").options
    for key, choices in (("w_lang", LANGS), ("w_policy", REUSE_POLICIES), ("w_model", models)):
        at.selectbox(key=key).set_value(choices[at.selectbox(key=key).proto.default])  # the option, not its label
    at.run()
    assert_clean(at)
    assert (dict(at.query_params), shown_text(at)) == (link, text)


# On SmolLM2's tokenizer the cached prompt is 11 tokens; Case 2 first differs at token 9.
@pytest.mark.parametrize(
    "policy, case, reused",
    [
        ("whole", "case1", 11),
        ("block", "case1", 8),
        ("radix", "case1", 11),
        ("whole", "case2", 0),
        ("block", "case2", 8),
        ("radix", "case2", 9),
    ],
)
def test_article_cases_load_in_one_click(policy, case, reused, embedded_model):
    at = start(view="prefix", policy=policy)  # the default block size (16): the case sets its own
    at.button(key=case).click().run()
    assert_clean(at)
    assert (at.query_params["block_size"], at.query_params["step"], at.query_params["view"]) == ("4", "1", "prefix")
    tokenizer = embedded_model.tokenizer
    cached, new = tokenizer.encode("解释什么是Transformer"), tokenizer.encode(at.session_state["w_prompt"])
    e = next(i for i, (a, b) in enumerate(zip(cached + [-1], new + [-2])) if a != b)
    expected = {
        "whole": len(cached) if e == len(cached) else 0,
        "radix": min(e, len(new) - 1),
        "block": min(e, len(new) - 1) // 4 * 4,
    }[policy]
    assert expected == reused  # the rule on this tokenizer, as the parameters above claim
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[strings.t("reused")] == str(reused)
    assert metrics[strings.t("computed")] == str(len(new) - reused)
    # The headline: the three policies side by side; the article's rule reads Case 1 as a hit, Case 2 as a miss.
    assert metrics[strings.t("policy_whole")] == strings.t("verdict_hit" if case == "case1" else "verdict_miss")
    assert metrics[strings.t("policy_" + policy)] == strings.t("verdict_hit" if reused else "verdict_miss")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_play_advances_one_token_per_tick_and_catches_up_with_its_clock(monkeypatch, embedded_model):
    clock = FakeClock()
    monkeypatch.setattr(step_fragment, "clock", clock)
    at = start(step=1)
    pace = at.session_state["p_pace"]
    at.toggle(key="p_playing").set_value(True).run()
    assert_clean(at)
    assert at.query_params["step"] == "2"
    for step in (3, 4):  # ticks on time: one token each
        clock.now += pace
        at.run()
        assert at.query_params["step"] == str(step)
    clock.now += 0.2 * pace  # an early tick still shows one more
    at.run()
    assert at.query_params["step"] == "5"
    clock.now += 3.8 * pace  # the draws fell behind by three ticks: the step keeps the clock
    at.run()
    assert at.query_params["step"] == "8"
    at.button(key="b_back").click().run()  # a step by hand starts Play's clock again, from there
    assert at.query_params["step"] == "8"  # Back to 7, and Play's tick in the same run
    clock.now += pace
    at.run()
    assert at.query_params["step"] == "9"


def test_downloads_offer_the_trace_and_the_tokens(embedded_model):
    at = start(step=2)
    assert_clean(at)
    labels = [b.label for b in at.get("download_button")]
    assert strings.t("download_trace") in labels and strings.t("download_tokens") in labels


def test_no_unfilled_placeholders_on_any_view(embedded_model):
    for lang in ("en", "zh"):
        for view in VIEWS:
            at = start(view=view, step=2, lang=lang, kv_splits=2)
            assert_clean(at)
            texts = [e.value for e in at.markdown if "<style>" not in e.value] + [t.value.to_string() for t in at.table]
            assert not [text for text in texts if "{" in text], (lang, view)


def test_cloud_entry_point_runs_the_same_app(embedded_model):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(
        str(Path(__file__).resolve().parent.parent / "cloud" / "streamlit_app.py"), default_timeout=120
    )
    at.query_params["step"] = "1"
    at.run()
    assert_clean(at)
    assert "What is a KV cache?" in shown_text(at)


# Words of the figures and tables that must not stay English on a Chinese page (issue 10), and the
# technical identifiers that are written the same in both languages.
ENGLISH_LABELS = (
    "position",
    "cached token",
    "same id",
    "reused",
    "policy",
    "block",
    "slot",
    "physical block",
    "bytes per token",
    "dtype",
    "layout",
    "split",
    "keys",
    "weight",
    "merged",
    "unsplit",
    "step",
    "phase",
    "tokens in",
    "p_top_k",
    "True",
    "False",
    "in use",
    "empty",
    "hit",
    "miss",
    "query",
    "key",
    "dimension",
    "layer",
)
SAME_IN_BOTH = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "lm_head",
    "head_dim",
    "K/V",
    "m_i",
    "l_i",
    "O_i",
    "w_i",
    "softmax",
    "top-k",
    "top-p",
    "GQA",
    "MHA",
    "bfloat16",
    "float32",
    "Split-KV",
    "FlashDecoding",
)


def figure_strings(spec: str) -> list[str]:
    """The words a Plotly figure shows: trace names, hover templates and texts, titles, annotations."""
    import json

    fig = json.loads(spec)
    out: list[str] = []
    for trace in fig.get("data", []):
        for key in ("name", "hovertemplate", "texttemplate"):
            if isinstance(trace.get(key), str):
                out.append(trace[key])
        text = trace.get("text")
        out += (
            [text]
            if isinstance(text, str)
            else [x for row in (text or []) for x in (row if isinstance(row, list) else [row]) if isinstance(x, str)]
        )
        if isinstance(trace.get("y"), list) and trace.get("orientation") == "h":  # bar labels on a category axis
            out += [y for y in trace["y"] if isinstance(y, str)]
        out.append(((trace.get("colorbar") or {}).get("title") or {}).get("text") or "")
    layout = fig.get("layout", {})
    out.append((layout.get("title") or {}).get("text") or "")
    for key, axis in layout.items():
        if key.startswith(("xaxis", "yaxis")):
            out.append((axis.get("title") or {}).get("text") or "")
    out += [a.get("text") or "" for a in layout.get("annotations", [])]
    return out


def page_strings(at, token_columns: set[str]) -> list[str]:
    texts = [
        e.value
        for kind in ("markdown", "caption", "info", "subheader")
        for e in getattr(at, kind)
        if "<style>" not in e.value
    ]  # the token stream shows the model's tokens, not labels
    texts += [m.label for m in at.metric] + [str(m.value) for m in at.metric]
    for frame in [e.value for e in at.dataframe] + [e.value for e in at.table]:
        texts += [str(c) for c in frame.columns] + [str(i) for i in frame.index.names if i]
        texts += [str(v) for c in frame.columns if c not in token_columns for v in frame[c]]
    for chart in at.get("plotly_chart"):
        texts += figure_strings(chart.proto.spec)
    return texts


def english_left(texts: list[str]) -> set[str]:
    import re

    found = set()
    for text in texts:
        for same in SAME_IN_BOTH:
            text = text.replace(same, " ")
        found |= {w for w in ENGLISH_LABELS if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", text, re.IGNORECASE)}
    return found


def test_no_english_label_is_left_on_the_chinese_page(embedded_model):
    words = strings.figure_words("zh")
    token_columns = {words[k] for k in ("cand_token", "bt_tokens", "align_cached_token", "align_new_token")}
    for view in VIEWS:
        at = start(view=view, step=2, lang="zh", kv_splits=2)
        assert_clean(at)
        if view == "prefix":  # load a case so the alignment and policy tables show too
            at.button(key="case1").click().run()
            assert_clean(at)
        texts = page_strings(at, token_columns)
        assert len(texts) > 5, view
        assert not english_left(texts), (view, english_left(texts))


def test_the_label_check_finds_english():
    assert english_left(["物理块 physical block", "p_top_k"]) == {"physical block", "block", "p_top_k"}
    assert english_left(["Split-KV：head_dim 与 top-k", "q_proj / K/V"]) == set()


def test_a_chinese_page_opens_with_a_chinese_prompt_and_a_short_link(embedded_model):
    at = start(lang="zh")
    assert_clean(at)
    assert "什么是 KV 缓存？KV 缓存是" in shown_text(at)
    # The Chinese embedded model (a base model: chat off), and neither written into the link.
    assert (at.session_state["w_model"], at.session_state["w_chat"]) == ("embedded-zh", False)
    assert "prompt" not in at.query_params and "model" not in at.query_params and "chat" not in at.query_params
    english = start()
    assert "What is a KV cache?" in shown_text(english) and english.session_state["w_model"] == "embedded"
    english.selectbox(key="w_lang").set_value("zh").run()  # switched on the English defaults: all follow
    assert_clean(english)
    assert (english.session_state["w_model"], english.session_state["w_chat"]) == ("embedded-zh", False)
    assert "什么是 KV 缓存？KV 缓存是" in shown_text(english) and "model" not in english.query_params


@pytest.mark.parametrize("family, learned", [("gpt2", True), ("llama", False)])
def test_the_next_input_is_labelled_as_the_model_builds_it(family, learned, monkeypatch, tiny_model_dir):
    """GPT-2 adds a learned position row to the token row; a RoPE model's next input is the token row alone."""
    import json

    folder = tiny_model_dir(family)
    monkeypatch.setenv("KVSCOPE_MODELS", folder)
    at = start(model=folder, chat=0, step=2)
    assert_clean(at)
    names = [trace.get("name") for chart in at.get("plotly_chart") for trace in json.loads(chart.proto.spec)["data"]]
    assert any("+ position row" in str(name) for name in names) == learned, names


def test_a_setting_whose_widget_state_was_dropped_comes_back(monkeypatch):
    """A page whose prompt widget lost its state keeps its prompt (it would read as empty and refuse to run);
    settings still held are left as they are."""
    from ui.page import page_state
    from ui.state import session

    at = start(prompt="Keep this prompt, please", chat=0, step=2)
    page = at.session_state["page"]
    assert page.drawn_state["prompt"] == "Keep this prompt, please" and page.drawn_state["chat"] is False
    state = {"page": page, "w_chat": True}  # the prompt's widget state is gone; chat was changed since
    monkeypatch.setattr(session.st, "session_state", state)  # the session's one door to Streamlit's state
    page_state.restore_lost_settings()
    assert state["w_prompt"] == "Keep this prompt, please" and state["w_chat"] is True


def test_a_stale_requests_widget_values_do_not_undo_what_the_page_drew(embedded_model):
    """A request sent before the page's last draw reached the browser (the follow strip's tick) carries the link and
    the widget values the browser had then: the paging chapter's blocks of 4 stay, though the request says 16 with
    the chapter before's link (tests/test_chapter_change.py meets it in Chromium). A block size changed on the page
    that shows the chapter is the user's, and stays too."""
    at = start(chapter=9)
    before = dict(at.query_params)  # the link the browser still has while the next chapter runs
    at.button(key="b_chapter_next").click().run()
    assert at.number_input(key="w_block_size").value == 4 and at.query_params["block_size"] == "4"
    at.query_params.clear()
    at.query_params.update(before)
    at.number_input(key="w_block_size").set_value(16).run()  # the browser's copy, from the chapter before's draw
    assert_clean(at)
    assert at.number_input(key="w_block_size").value == 4
    assert at.query_params["chapter"] == "10" and at.query_params["block_size"] == "4"
    assert "blocks** of 4 positions" in at.container("chapter").markdown[0].value  # the chapter's text, as drawn
    at.number_input(key="w_block_size").set_value(8).run()  # from the page that shows blocks of 4: the user's
    assert at.number_input(key="w_block_size").value == 8 and at.query_params["block_size"] == "8"


def test_a_base_model_turns_the_chat_switch_off_and_says_so(embedded_zh_model):
    """Gemma 3 270M has no chat template: a link that asks for chat on it runs the prompt as it is, with a message,
    and the switch is greyed."""
    at = start(model="embedded-zh", chat=1, prompt="什么是KV缓存？KV缓存是", step=1)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["w_chat"] is False and at.toggle(key="w_chat").disabled
    assert any(strings.t("reason_no_chat_template") in w.value for w in at.warning)
    assert at.query_params.get("chat") == "0"
    assert shown_text(at).startswith("<bos>什么是KV缓存？KV缓存是")  # no template around it


@pytest.mark.parametrize("lang", LANGS)
def test_a_heatmap_longer_than_the_step_memory_is_left_out_with_a_message(embedded_model, monkeypatch, lang):
    """At KVSCOPE_STEP_MEMORY_MB=16 SmolLM2's full heatmap fits about 200 positions, fewer than the host's 384-token
    prompt: the attention view says so in the page's language, still draws the newest row, and Next still steps."""
    monkeypatch.setenv("KVSCOPE_STEP_MEMORY_MB", "16")
    prompt = " ".join(["The cache keeps every position it was given."] * 30)
    at = start(view="attention", prompt=prompt, chat=0, step=1, lang=lang, model="embedded")
    assert_clean(at)
    said = [i.value for i in at.info if "KVSCOPE_STEP_MEMORY_MB" in i.value]
    assert len(said) == 1, [i.value for i in at.info]
    n, limit = (int(number.replace(",", "")) for number in re.findall(r"\d[\d,]*", said[0])[:2])
    assert limit < n, said
    assert said[0] == strings.t("heatmap_over_budget", lang, positions=n, limit=limit)
    assert at.get("plotly_chart"), "the newest row is not drawn either"
    at.button(key="b_next").click().run()
    assert_clean(at)
    assert at.query_params["step"] == "2"
