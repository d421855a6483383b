"""Every control of the page, clicked in headless Chromium at projector size (1280×720): each press must change
what the page shows and what its link says, as a student's click would (AppTest reruns the whole script,
so it cannot tell a control that works only on the next rerun from one that works at once).

The session's server (conftest.py) and a fresh page per test; each test opens the page from a link, so it starts
from a known state (what a fresh server's first page says: tests/test_browser.py). Needs Debian's chromium and the
`playwright` package, as tests/test_browser.py.
"""

from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from tests.app_helpers import VIEW_TITLES
from tests.helpers import (
    COUNT_SENDS,
    WAIT_MS,
    Received,
    choose,
    idle,
    link,
    metric_value,
    press,
    until_link,
    wait_until,
    widget,
)
from tests.server import running_server, settled_text
from ui.state.link import VIEWS
from ui.text import strings
from ui.views import OWN_STEPS
from ui.views.cases import CASE_BLOCK_SIZE, CASE_CACHED, CASES

pytestmark = pytest.mark.browser

MAIN = '[data-testid="stMain"]'
PAGE = {"accept_downloads": True}  # the module's page (conftest.py)


# -- helpers ------------------------------------------------------------------------------------


def open_page(page, server: str, **params) -> str:
    page.goto(f"{server}/?{urlencode(params)}")
    return settled_text(page)


def toggle(page, key: str) -> None:
    widget(page, key).locator("label").first.click()


def number(page, key: str, value: int) -> None:
    field = widget(page, key).locator("input")
    field.fill(str(value))
    field.press("Enter")


def nudge(page, key: str, arrow: str, times: int = 1) -> None:
    """Move a slider's thumb with the keyboard, as a student on a laptop would."""
    idle(page)
    thumb = slider(page, key)
    thumb.focus()
    for _ in range(times):
        thumb.press(arrow)


def slider(page, key: str):
    return widget(page, key).locator('input[type="range"]')


def slider_value(page, key: str) -> float:
    return float(slider(page, key).evaluate("el => el.value"))


def text_on_page(page, text: str) -> None:
    """Wait until `text` is in the document (figure titles are SVG text, outside inner_text)."""
    page.wait_for_function("t => document.body.textContent.includes(t)", arg=text, timeout=WAIT_MS)


# -- sidebar ------------------------------------------------------------------------------------


def test_language_and_large_text(server, page):
    open_page(page, server, policy="radix")  # a setting whose labels are translated keeps its value
    choose(page, "w_lang", strings.LANGUAGE_NAMES["zh"])
    until_link(page, lang="zh", policy="radix")
    # On the English defaults, Chinese moves the page to the Chinese model and its prompt.
    page.wait_for_function(
        "() => (document.querySelector('.st-key-generated code') || {}).textContent?.includes('KV 缓存是')",
        timeout=WAIT_MS,
    )
    settled_text(page)
    expect(page.locator("h1").first).to_have_text(strings.t("title", "zh"))
    toggle(page, "w_large")
    until_link(page, lang="zh", large="1", policy="radix")
    assert "font-size: 125%" in page.content()
    choose(page, "w_lang", strings.LANGUAGE_NAMES["en"])
    until_link(page, lang=None, large="1")  # English is the default: not in the link
    expect(page.locator("h1").first).to_have_text(strings.t("title", "en"))


def test_model_selector_lists_the_allowed_models(server, page):
    before = open_page(page, server, step=1)
    choose(page, "w_model", "embedded")
    idle(page)
    assert settled_text(page) == before and link(page).get("model") is None


def test_prompt_chat_and_sampling_settings_reach_the_text_and_the_link(server, page):
    open_page(page, server, step=2)
    prompt = "Name three colours."
    field = widget(page, "w_prompt").locator("textarea")
    field.fill(prompt)
    field.press("Control+Enter")
    text = until_link(page, prompt=prompt)
    assert prompt in text and not text.startswith(prompt)  # inside the chat template
    toggle(page, "w_chat")
    assert until_link(page, prompt=prompt, chat="0").startswith(prompt)
    greedy = settled_text(page)
    nudge(page, "w_temperature", "ArrowRight", 20)
    until_link(page, temperature="1.0")
    number(page, "w_seed", 7)
    sampled = until_link(page, temperature="1.0", seed="7")
    assert sampled.startswith(prompt) and sampled != greedy
    number(page, "w_top_k", 5)
    until_link(page, top_k="5")
    nudge(page, "w_top_p", "ArrowLeft", 10)
    until_link(page, top_k="5", top_p="0.9")
    assert link(page)["step"] == "2"  # the settings changed the run, not the step


def test_cache_settings(server, page):
    open_page(page, server, step=1, view="split")
    number(page, "w_block_size", 8)
    until_link(page, block_size="8")
    number(page, "w_kv_splits", 2)
    until_link(page, block_size="8", kv_splits="2")
    choose(page, "w_policy", strings.t("policy_radix"))
    until_link(page, block_size="8", kv_splits="2", policy="radix")
    metric = page.locator('[data-testid="stMetric"]', has_text=strings.t("splits"))
    expect(metric.locator('[data-testid="stMetricValue"]')).to_have_text("2")


# -- stepping -----------------------------------------------------------------------------------


def test_step_buttons(server, page):
    open_page(page, server)
    assert link(page)["step"] == "0"
    press(page, "b_prefill")
    until_link(page, step="1")
    press(page, "b_next")
    until_link(page, step="2")
    press(page, "b_next")
    three = until_link(page, step="3")
    press(page, "b_back")
    two = until_link(page, step="2")
    assert three.startswith(two) and len(three) > len(two)
    press(page, "b_reset")
    until_link(page, step="0")
    expect(widget(page, "b_back").locator("button")).to_be_disabled()


# Records every moment the step's header is missing from the page (a placeholder blanking it while a step runs).
WATCH_HEADER = """() => { window.kvHeaderGone = 0;
  new MutationObserver(() => { if (!document.querySelector('.kv-counter')) window.kvHeaderGone += 1; })
    .observe(document.body, {childList: true, subtree: true}); }"""


@pytest.mark.parametrize("lesson", [{}, {"chapter": 4}], ids=["free", "lesson"])
def test_the_steps_header_is_never_blank_while_a_step_runs(server, page, lesson):
    open_page(page, server, step=2, **lesson)
    page.evaluate(WATCH_HEADER)
    for step in (3, 4, 5):
        press(page, "b_next")
        until_link(page, step=str(step))
        expect(page.locator(".kv-counter")).to_contain_text(str(step))
    press(page, "b_back")
    until_link(page, step="4")
    assert page.evaluate("() => window.kvHeaderGone") == 0


def test_play_and_pace(server, page):
    """Play steps at the pace set; once it is off, no tick is sent however long the page waits: the page's timers
    run on a clock the test stops and moves on by ten paces (no sleep)."""
    page.add_init_script(COUNT_SENDS)
    page.clock.install()  # runs as a real clock until paused
    sent = Received(page)
    open_page(page, server, step=1)
    pace = slider_value(page, "p_pace")
    nudge(page, "p_pace", "ArrowLeft", 3)
    page.wait_for_function(
        "v => Math.abs(document.querySelector('.st-key-p_pace input').value - v) < 1e-6",
        arg=pace - 0.3,
        timeout=WAIT_MS,
    )
    idle(page)
    expect(widget(page, "p_pace").locator('[data-testid="stSliderThumbValue"]')).to_have_text(f"{pace - 0.3:.2f}")
    toggle(page, "p_playing")
    page.wait_for_function("() => Number(new URL(location.href).searchParams.get('step')) >= 3", timeout=WAIT_MS)
    sent.clear()
    toggle(page, "p_playing")
    wait_until(page, lambda: sent.carries("w_top_p"))  # the toggle's run of the whole page (a tick's has no sidebar)
    idle(page)  # ... has finished: a tick already scheduled has been sent by now
    page.clock.pause_at(page.evaluate("Date.now()") + 1)  # from here no timer fires unless the test moves the clock
    sends = page.evaluate("window.kvSent")
    page.clock.run_for(10_000)  # over ten paces: a Play still on would tick
    assert page.evaluate("window.kvSent") == sends  # stopped: no more ticks
    page.clock.resume()


# -- the step and chapter buttons' keys, whatever was clicked last ------------------------------------
# Each control below is a click and the wait for what it changed to be drawn (a key pressed during that run would
# meet greyed buttons, whose keys are unbound).


def click_then_key(page, click, drawn, key: str, **arrives) -> None:
    """Click a control, wait until the page has drawn what it changed, press `key`: the link then says `arrives`."""
    click()
    drawn()
    idle(page)
    page.keyboard.press(key)
    until_link(page, **arrives)


def nothing() -> None:
    """The wait after a click that starts no run (an expander whose content is always built)."""


def view_radio(page, view: str):
    label = widget(page, "w_view").locator("label", has_text=strings.t("view_" + view))
    return label.click, lambda: until_link(page, view=view)


def layer_picker(page):
    """The layer picker's + (− on the last layer)."""
    picker = widget(page, "w_layer")
    layer = int(picker.locator("input").input_value())
    up = picker.get_by_test_id("stNumberInputStepUp")
    move = 1 if up.is_enabled() else -1
    button = up if move == 1 else picker.get_by_test_id("stNumberInputStepDown")
    return button.click, lambda: until_link(page, layer=str(layer + move))


def scores_on(page):
    return lambda: toggle(page, "v_scores"), lambda: text_on_page(page, "s = q·k/√d")


def batch_slider(page, at: float):
    """A mouse click on the batch slider's track at `at` of its length (the thumb jumps there)."""
    track = widget(page, "v_batch").locator('[data-rac][data-orientation="horizontal"]').last

    def click():
        box = track.bounding_box()
        track.click(position={"x": box["width"] * at, "y": box["height"] / 2})

    def drawn():  # the step's bytes for that batch: "B = 16 at …"
        page.wait_for_function(
            "b => new RegExp('B = ' + b + '\\\\D').test(document.body.textContent)",
            arg=int(slider_value(page, "v_batch")),
            timeout=WAIT_MS,
        )

    return click, drawn


def test_arrow_keys_step_whatever_control_was_clicked_last(server, page):
    """→ and ← (the step buttons' badges) step after a click on the view radio, the layer picker, a toggle, an
    expander or a slider (a clicked radio used to take → as its own); in the prompt's text area → moves the caret
    and does not step. In English only: the keys' script is the same in every language (the Chinese lesson walk,
    tests/test_lesson_walk.py, presses → after the lesson's controls in Chinese)."""
    open_page(page, server)
    press(page, "b_prefill")
    until_link(page, step="1")
    click_then_key(page, *view_radio(page, "attention"), "ArrowRight", step="2")
    click_then_key(page, *layer_picker(page), "ArrowRight", step="3")
    click_then_key(page, *scores_on(page), "ArrowLeft", step="2")
    card = page.locator('[data-testid="stExpander"]', has_text=strings.t("card_title")).locator("summary")
    click_then_key(page, card.click, nothing, "ArrowRight", step="3")
    click_then_key(page, *view_radio(page, "costs"), "ArrowRight", step="4")
    click_then_key(page, *batch_slider(page, 0.25), "ArrowRight", step="5")
    click_then_key(page, *batch_slider(page, 0.75), "ArrowLeft", step="4")
    prompt = widget(page, "w_prompt").locator("textarea")
    prompt.click()
    prompt.evaluate("el => el.setSelectionRange(0, 0)")
    prompt.press("ArrowRight")
    assert prompt.evaluate("el => el.selectionStart") == 1  # the caret moved: no shortcut took the key
    idle(page)
    assert link(page)["step"] == "4"


# -- views and their own controls ---------------------------------------------------------------


def test_attention_pickers_and_scores(server, page, embedded_model):
    open_page(page, server, step=2, view="attention")
    number(page, "w_layer", 1)
    until_link(page, layer="1")
    number(page, "w_head", 2)
    until_link(page, layer="1", head="2")
    text_on_page(page, strings.t("heatmap_title", layer=1, head=2, kv=2 // embedded_model.info.gqa_group).split(":")[0])
    toggle(page, "v_scores")
    idle(page)
    text_on_page(page, "s = q·k/√d")


def test_kv_radio_and_expanders(server, page):
    open_page(page, server, step=2, view="kv", layer=0, head=0)
    widget(page, "v_kv").locator("label", has_text="V").click()
    idle(page)
    text_on_page(page, strings.t("values_title", which="V", layer=0, kv=0, head=0).split(":")[0])
    open_page(page, server, step=2, view="split", kv_splits=2)
    # The last two are built only once opened: what they hold must then arrive
    for title, content in (
        ("example_title", "stDataFrame"),
        ("merge_table", "stDataFrame"),
        ("candidates_fig", "stPlotlyChart"),
    ):
        expander = page.locator('[data-testid="stExpander"]', has_text=strings.t(title))
        expect(expander.locator(f'[data-testid="{content}"]')).to_have_count(0 if title != "example_title" else 1)
        expander.locator("summary").click()
        details = expander.locator('[data-testid="stExpanderDetails"]')
        expect(details).to_be_visible()
        expect(details.locator(f'[data-testid="{content}"]')).to_be_visible()


def test_split_view_at_one_split_shows_a_demonstration(server, page):
    open_page(page, server, step=2, view="split")
    expect(page.locator(MAIN).get_by_text(strings.t("split_demo", splits=4)[:40])).to_be_visible()
    metric = page.locator('[data-testid="stMetric"]', has_text=strings.t("splits"))
    expect(metric.locator('[data-testid="stMetricValue"]')).to_have_text("4")


def test_costs_truncation_slider(server, page):
    open_page(page, server, step=2, view="costs")
    keep = slider_value(page, "v_keep")
    kept = truncated(page)
    nudge(page, "v_keep", "ArrowRight", 2)
    page.wait_for_function(
        "v => document.querySelector('.st-key-v_keep input').value == v", arg=keep + 2, timeout=WAIT_MS
    )
    # the thumb moves before the rerun starts, so "idle" alone can be read before it: wait for the text itself
    page.wait_for_function(
        "kept => [...document.querySelectorAll('[data-testid=stMain] [data-testid=stCode]')]"
        ".some(el => el.innerText.trim().startsWith('…') && el.innerText.trim() !== kept)",
        arg=kept,
        timeout=WAIT_MS,
    )
    idle(page)
    longer = truncated(page)
    assert longer.endswith(kept.lstrip("…"))


def truncated(page) -> str:
    """The text the truncation keeps (shown after "…")."""
    codes = page.locator(MAIN + ' [data-testid="stCode"]').all_inner_texts()
    return next(text.strip() for text in codes if text.strip().startswith("…"))


def test_template_toggle_and_downloads(server, page):
    open_page(page, server, step=2)
    assert page.locator(".kv-template").count() == 0
    toggle(page, "v_show_template")
    expect(page.locator(".kv-template").first).to_be_visible(timeout=WAIT_MS)
    idle(page)  # the run that drew it has finished: a download pressed now is not lost to a rerun
    for key, name in (("dl_trace", "kvscope-step-2.json"), ("dl_tokens", "kvscope-tokens-step-2.csv")):
        with page.expect_download(timeout=WAIT_MS) as download:
            press(page, key)
        assert download.value.suggested_filename == name


@pytest.fixture(scope="module")
def small_open_host(tmp_path_factory) -> str:
    """A server whose step budget (KVSCOPE_STEP_MEMORY_MB) is at its floor of 16 and which allows any model
    (KVSCOPE_ALLOW_ANY_MODEL=1): one configuration for the two tests below, each about one of its settings."""
    env = {"KVSCOPE_STEP_MEMORY_MB": "16", "KVSCOPE_ALLOW_ANY_MODEL": "1"}
    with running_server(tmp_path_factory.mktemp("small-open-host") / "log.txt", env=env) as (url, _):
        yield url


def test_a_heatmap_over_the_step_budget_is_left_out_and_the_page_steps_on(small_open_host, page):
    """A host whose step budget cannot hold this prompt's attention heatmap: the view says so (an info, no error,
    no "start this session again"), in a browser, and → still steps. (The restart button after a step that
    failed is clicked in tests/test_bad_input.py's injected fault.)"""
    prompt = "one two three four five six seven eight nine ten " * 30  # ~300 tokens: over the heatmap limit
    page.goto(f"{small_open_host}/?{urlencode({'prompt': prompt, 'chat': '0', 'step': '1', 'view': 'attention'})}")
    idle(page)
    info = page.locator(MAIN + ' [data-testid="stAlertContentInfo"]', has_text="KVSCOPE_STEP_MEMORY_MB")
    expect(info).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator(MAIN + ' [data-testid="stAlertContentError"]')).to_have_count(0)
    expect(page.get_by_role("button", name=strings.t("reset_session"))).to_have_count(0)
    press(page, "b_next")
    until_link(page, step=2, view="attention")
    expect(info).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator(MAIN + ' [data-testid="stAlertContentError"]')).to_have_count(0)
    assert prompt.strip() in settled_text(page)


def test_use_the_default_model_after_a_model_fails_to_load(small_open_host, page):
    """A host that allows any model, a link naming one that cannot be read offline: the page says why and
    offers the embedded default, which then loads and steps."""
    page.goto(f"{small_open_host}/?model=nobody/no-such-model&step=1")
    idle(page)
    expect(page.locator(MAIN + ' [data-testid="stAlertContentError"]')).to_contain_text(
        "no-such-model", timeout=WAIT_MS
    )
    page.get_by_role("button", name=strings.t("use_default")).click()
    text = until_link(page, model=None, step=1)
    assert "What is a KV cache?" in text


# -- the article's cases, at the default settings ------------------------------------------------


def case_reuse(tokenizer, case: str) -> dict[str, int]:
    """The three policies' rules on the case's token ids (block size 4), written out independently."""
    cached, new = tokenizer.encode(CASE_CACHED), tokenizer.encode(CASES[case])
    first = next(i for i, (a, b) in enumerate(zip(cached + [-1], new + [-2])) if a != b)
    return {
        "whole": len(cached) if first == len(cached) else 0,
        "radix": min(first, len(new) - 1),
        "block": min(first, len(new) - 1) // CASE_BLOCK_SIZE * CASE_BLOCK_SIZE,
        "first": first,
        "n": len(new),
    }


@pytest.mark.parametrize("case, lang", [("case1", "en"), ("case2", "en"), ("case1", "zh")])
def test_article_case_loads_in_one_click_at_the_defaults(server, page, embedded_model, case, lang):
    # SmolLM2 in both languages (a Chinese page would open on embedded-zh; the Chinese lesson walk reads its Case 2)
    open_page(page, server, view="prefix", **({"lang": lang, "model": "embedded"} if lang != "en" else {}))
    press(page, case)
    chat_off = "0" if lang == "en" else None  # a Chinese page's default is chat off: not in its link
    until_link(page, prompt=CASES[case], chat=chat_off, block_size=str(CASE_BLOCK_SIZE), step="1", view="prefix")
    expected = case_reuse(embedded_model.tokenizer, case)
    whole = "verdict_hit" if case == "case1" else "verdict_miss"
    assert metric_value(page, "verdict_whole") == strings.t(whole, lang)
    for policy in ("whole", "block", "radix"):
        reused = expected[policy]
        caption = strings.t("policy_counts", lang, reused=reused, computed=expected["n"] - reused, first=reused)
        expect(widget(page, f"verdict_{policy}")).to_contain_text(caption)
    first = page.locator('[data-testid="stMetric"]', has_text=strings.t("first_difference", lang))
    expect(first.locator('[data-testid="stMetricValue"]')).to_have_text(str(expected["first"]))
    assert (case == "case2") == (expected["first"] < len(embedded_model.tokenizer.encode(CASE_CACHED)))


WORST_CASE = {
    "prompt": " ".join(["token"] * 382),
    "chat": 0,
    "block_size": 1,
    "step": 128,
    "temperature": 1,
    "seed": 3,
}  # the limits' worst case for going back: 510 blocks of one slot


def test_back_moves_one_step_on_every_view_at_the_limits_worst_case(server, page):
    """From step 128 of a 382-token prompt in blocks of one slot, each view in turn (from the radio; the KV view
    with its own pool, then with the busy one): ← lands one step back and draws it, with no error (how long it
    takes: bench/browser_latency.py --parts worst). One page: the run is the link's, each view reads it at the
    step ← reached. Each view opened from the radio shows its own title."""
    open_page(page, server, **WORST_CASE)
    step = int(link(page)["step"])
    assert step > 100  # the run went on (no end of text early)
    moves = []
    for view in VIEWS[1:] + VIEWS[:1]:  # the views after flow, then flow
        moves.append((view, "own"))
        if view == "kv":
            moves.append((view, "busy"))  # the KV view again, on the busy pool
    for view, pool in moves:
        if pool == "busy":
            widget(page, "w_pool").locator("label", has_text=strings.t("pool_busy")).click()
            until_link(page, view=view, pool="busy", step=step)
        elif view in OWN_STEPS:  # its step is its run's (a server's, a verify pass): all ended long before step 100
            widget(page, "w_view").locator("label", has_text=strings.t("view_" + view)).click()
            until_link(page, view=view)
            step = int(link(page)["step"])
            assert step < 100  # its run's own length (the speculative view's 48 tokens: at most 48 passes)
            if view == "serving":  # every request finished: the server's last step
                assert page.locator(".st-key-b_next button").is_disabled()
            expect(page.locator(MAIN + " h3", has_text=strings.t(VIEW_TITLES[view])).first).to_be_visible()
        else:
            widget(page, "w_view").locator("label", has_text=strings.t("view_" + view)).click()
            until_link(page, view=None if view == "flow" else view, step=step)  # the default view is not in the link
            expect(page.locator(MAIN + " h3", has_text=strings.t(VIEW_TITLES[view])).first).to_be_visible()
        press(page, "b_back")
        step -= 1
        until_link(page, step=step)
        expect(page.locator(".kv-counter")).to_contain_text(str(step))
        assert page.locator('[data-testid="stException"]').count() == 0, (view, pool)
        assert page.locator(MAIN + ' [data-testid="stAlertContentError"]').count() == 0, (view, pool)
