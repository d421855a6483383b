"""The speculative view and its chapter ("Several tokens per pass"), on both embedded models: each pass's sentence,
counter, figure and totals say what the engine's own passes did (recomputed here from `engine.speculative`); ← goes
back a pass; the measurement times plain decoding and both drafts, greedy ones with plain decoding's tokens; bad
settings are messages; the chapter's numbers are the pass's (tests/test_lesson.py calls `speculative_numbers`)."""

import functools

import pytest
from playwright.sync_api import expect

from engine.drafts import PromptLookup
from engine.speculative import SpeculativeGeneration
from engine.timing import weight_bytes_read
from tests.app_helpers import assert_clean, start
from tests.helpers import choose, idle, until_link, widget
from ui.lesson.chapters import CHAPTERS
from ui.runs.speculative import MAX_TOKENS, PROMPTS
from ui.text import strings

PAGES = [("embedded", "en", True), ("embedded-zh", "zh", False)]
FIXTURES = {"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}
CHAPTER = next(c for c in CHAPTERS if c.key == "speculative")


@functools.cache
def reference_passes(model, lang: str, chat: bool, which: str = "edit", k: int = 5):
    """The view's prompt decoded by the engine's speculative generation itself, with prompt lookup (once a test run)."""
    with SpeculativeGeneration(
        model, PROMPTS[(which, lang, chat)], PromptLookup(k), chat=chat, max_new_tokens=MAX_TOKENS
    ) as generation:
        generation.run()
        return generation.passes


def bytes_per_token(model, passes) -> tuple[float, float]:
    """MiB read a token over the passes after the prefill: a pass reads the weights and every cached position's K/V
    once (what it wrote included); plain decoding, once a token."""
    info = model.info
    weights = weight_bytes_read(info)
    decode = passes[1:]
    tokens = sum(len(p.added) for p in decode)
    spec = sum(weights + info.kv_bytes(p.first_position + len(p.fed)) for p in decode)
    plain = sum(weights + info.kv_bytes(p.first_position + 1 + i) for p in decode for i in range(len(p.added)))
    return spec / tokens / 2**20, plain / tokens / 2**20


def speculative_numbers(model, lang: str, chat: bool, step: int) -> list[str]:
    """What chapter 19 must quote at pass `step`: k, the rows fed, the tokens added, the rows discarded, the totals
    so far and the bytes a token against plain decoding."""
    passes = reference_passes(model, lang, chat)[:step]
    done = passes[-1]
    tokens = sum(len(p.added) for p in passes)
    spec, plain = bytes_per_token(model, passes)
    numbers = [
        5,
        done.rows_written,
        str(strings.t("count_tokens", lang, n=len(done.added))),
        len(done.fed) - done.kept_rows,
        tokens,
        len(passes),
        f"{tokens / len(passes):.2f}",
        f"{spec:,.1f}",
        f"{plain:,.1f}",
    ]
    return [str(x) for x in numbers]


def plain_answer_equal(model, lang: str, chat: bool, step: int) -> bool:
    """Whether the chapter's answer after `step` passes is plain greedy decoding's (its claim)."""
    import engine

    ids = [t for p in reference_passes(model, lang, chat)[:step] for t in p.added]
    with engine.Generation(
        model, PROMPTS[("edit", lang, chat)], chat=chat, max_new_tokens=len(ids), capture=engine.NO_RECORD
    ) as generation:
        generation.prefill()
        while not generation.finished:
            generation.step()
        return generation.generated == ids


def free_guesses_worse(model, lang: str, chat: bool) -> bool:
    """The question's premise: the free answer makes fewer tokens a pass than the code edit."""

    def per_pass(which):
        passes = reference_passes(model, lang, chat, which)
        return sum(len(p.added) for p in passes) / len(passes)

    return per_pass("free") < per_pass("edit")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p[0]}-{p[1]}")
def test_each_pass_says_and_draws_what_the_engine_did(page, request):
    name, lang, chat = page
    model = request.getfixturevalue(FIXTURES[name])
    reference = reference_passes(model, lang, chat)
    at = start(view="speculate", step=2, model=name, lang=lang)
    assert_clean(at)
    assert not at.warning, [w.value for w in at.warning]
    for step in (2, 3, 2):  # forward a pass, then ← back
        done = reference[step - 1]
        text = " ".join(m.value for m in at.markdown)
        assert (
            strings.t(
                "spec_added", lang, n=len(done.added), discarded=done.rows_discarded, blocks=len(done.blocks_returned)
            )
            in text
        ), step
        assert strings.t("spec_pass_title", lang, step=step, rows=done.rows_written, kept=done.kept_rows) in text, step
        figure = at.get("plotly_chart")[0].proto.spec  # each guess and the model's tokens in the hover
        assert all(f"guess {i + 1}:" in figure or f"猜测 {i + 1}：" in figure for i in range(len(done.guesses))), step
        assert at.query_params["step"] == str(step)
        if step == 2:
            at.button(key="b_next").click().run()
        else:
            at.button(key="b_back").click().run()
        assert_clean(at)


def test_the_measurement_times_plain_decoding_and_both_drafts(embedded_model):
    at = start(view="speculate", step=1)
    at.button(key="v_spec_measure").click().run()
    assert_clean(at)
    frame = at.dataframe[-1].value
    assert len(frame) == 3 and list(frame.iloc[:, -1]) == ["✓", "✓", "✓"], frame  # greedy: plain decoding's tokens
    passes = list(frame.iloc[:, 1])
    assert passes[0] == frame.iloc[0, 2], "plain decoding makes one token a pass"
    assert passes[1] < passes[0], "prompt lookup on the code edit makes several tokens a pass"


@pytest.mark.parametrize(
    "link, problem",
    [
        (dict(draft_k="0"), "out_of_range"),
        (dict(draft_k="x"), "bad_number"),
        (dict(draft="medusa"), "unknown_choice"),
        (dict(draft="early_exit", draft_n="30"), "out_of_range"),
        (dict(spec_prompt="<b>"), "unknown_choice"),
    ],
)
def test_bad_settings_are_a_message_and_the_view_still_runs(link, problem, embedded_model):
    at = start(view="speculate", step=2, **link)
    assert_clean(at)
    reason = str(strings.t("reason_" + problem))
    assert any(reason in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.get("plotly_chart"), "the view stopped drawing"
    at.button(key="b_next").click().run()
    assert_clean(at)
    assert at.query_params["step"] == "3"


@pytest.mark.browser
def test_the_views_controls_and_arrows_reach_the_link_and_the_pass(server, page):
    """In Chromium: → and ← step verify passes; the prompt radio, the draft's select box, k's slider and n's number
    input each reach the link and redraw the pass."""
    page.goto(f"{server}/?view=speculate&step=2")
    until_link(page, step="2", view="speculate")
    title = page.locator(".kv-figure-title").first
    expect(title).to_contain_text("Pass 2:")
    page.locator(".st-key-b_next button").click()
    until_link(page, step="3")
    expect(title).to_contain_text("Pass 3:")
    page.keyboard.press("ArrowLeft")  # the last control clicked was Next: the arrows step the passes
    until_link(page, step="2")
    expect(title).to_contain_text("Pass 2:")
    idle(page)
    widget(page, "w_spec_prompt").locator("label", has_text=strings.t("spec_prompt_free")).click()
    until_link(page, spec_prompt="free", step="2")
    expect(page.locator(".st-key-generated code")).not_to_contain_text("total_price")  # the free answer's text
    idle(page)
    slider = widget(page, "w_draft_k").get_by_role("slider")
    slider.focus()
    slider.press("ArrowLeft")
    until_link(page, draft_k="4", step="2")
    choose(page, "w_draft", strings.t("fig_spec_draft_early_exit"))
    until_link(page, draft="early_exit", step="2")
    expect(title).to_contain_text("Pass 2:")
    idle(page)
    widget(page, "w_draft_n").get_by_test_id("stNumberInputStepUp").click()
    until_link(page, draft_n="7", step="2")
    expect(page.locator(".st-key-main-figure")).to_be_visible()
    assert page.locator('[data-testid="stException"]').count() == 0
