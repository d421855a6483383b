"""The lesson: every chapter opens from its link in both languages, puts the page in the state it claims,
and quotes the model's own numbers (computed here from model.info and an engine run of our own, not from
the chapter's text); a real browser moves through the chapters with PageDown / PageUp, the buttons and the
list, and leaves the lesson keeping the page as it is."""

import re
from functools import cache

import pytest
from playwright.sync_api import expect

import engine
from tests.app_helpers import VIEW_TITLES, assert_clean, open_whole_view, start
from tests.test_app import english_left
from tests.runs import decode
from tests.helpers import WAIT_MS, Received, press
from tests.server import browser_page, settled_text
from ui import strings
from ui.cases import CASE_BLOCK_SIZE, CASE_CACHED, CASES
from ui.lesson import CHAPTERS
from ui.state import default_prompt, parse_query
from viz.style import fmt_size

def lesson_text(at) -> str:
    """The lesson's header (the chapter's title) and its panel, where the chapter's text and numbers are."""
    panel = at.container("chapter")
    return "\n".join([t.value for t in at.title] + [m.value for m in panel.markdown] + [c.value for c in panel.caption])


@cache
def own_trace(model: engine.Model, prompt: str, step: int, block_size: int, kv_splits: int, chat: bool = True):
    """The trace of `step` on the page's default run, from a session of our own."""
    session, traces = decode(model, prompt, step - 1, chat=chat, block_size=block_size, kv_splits=kv_splits)
    return session, traces[step - 1]


def case_reuse(model: engine.Model, case: str) -> dict:
    """What real prefix caches reuse of the article's case after its cached prompt ran, per policy."""
    out = {}
    for policy in engine.POLICIES:
        cache_ = engine.PrefixCache(model, policy=policy, block_size=CASE_BLOCK_SIZE)
        for prompt in (CASE_CACHED, CASES[case]):
            session = engine.DecodeSession(model, prompt, prefix_cache=cache_, max_new_tokens=1)
            out[policy] = session.prefill().prefix.reused_tokens
            session.close()
    return out


def expected_numbers(chapter, model: engine.Model, lang: str) -> list[str]:
    """The numbers this chapter must quote, as the page formats them."""
    info = model.info
    element = model.weights.embed_tokens.element_size()
    kv = 2 * info.layers * info.kv_heads * info.head_dim * element
    if chapter.case:
        tokenizer = model.tokenizer
        cached, new = tokenizer.encode(CASE_CACHED), tokenizer.encode(CASES[chapter.case])
        reuse = case_reuse(model, chapter.case)
        first = next(i for i, (a, b) in enumerate(zip(cached + [-1], new + [-2])) if a != b)
        numbers = [reuse["whole"], reuse["block"], reuse["radix"]]
        return [str(x) for x in numbers + ([first] if chapter.case == "case2" else [len(cached), len(new)])]
    chat = parse_query({"lang": lang})[0].chat  # the language's default: off for the Chinese (base) model
    session, trace = own_trace(model, default_prompt(lang), chapter.step, chapter.settings["block_size"],
                               chapter.settings["kv_splits"], chat)
    n, context = len(session.prompt_ids), trace.context_length
    per_position = 2 * info.kv_heads * info.head_dim * element  # K and V of one position in one layer

    def kv_at(length):  # every layer's K/V at `length` positions: a sliding-window layer keeps at most its window
        windows = info.layer_windows or (None,) * info.layers
        return per_position * sum(length if w is None else min(length, w) for w in windows)
    numbers = {
        "tokens": lambda: [f"{info.vocab:,}", info.hidden, n],
        "prefill": lambda: [n, info.layers, f"{kv:,}", f"id {trace.token_id}", f"{context * kv / 1024:,.1f}"],
        "decode": lambda: [info.layers, f"{info.hidden} × {info.vocab:,}", trace.token_id, trace.positions[-1]],
        "two_paths": lambda: [trace.token_id, info.hidden],
        "residual": lambda: [info.layers, 2 * info.layers],
        "attention": lambda: [f"√{info.head_dim}", context],
        "gqa": lambda: [f"{info.q_heads} × {info.head_dim} = {info.q_heads * info.head_dim}",
                        f"{2 * info.layers * info.q_heads * info.head_dim * element:,}", info.kv_heads],
        "kv_cache": lambda: [f"2 × {info.layers} × {info.kv_heads} × {info.head_dim} × {element} = {kv:,}", context],
        "paging": lambda: [len(trace.block_table), context, "0 → "],
        "long_context": lambda: [f"{kv_at(context) / 2**20:,.2f}", context, info.layers,
                                 *crossovers(info, context, kv_at)],
        "split_kv": lambda: [len(trace.split.ranges), f"{trace.split.max_abs_diff.max().item():.1e}"],
        "context_window": lambda: [f"{info.context_limit:,}", f"{kv:,}"],
        "sliding_window": lambda: window_numbers(info, context, kv_at),
    }[chapter.key]()
    return [str(x) for x in numbers]


def window_numbers(info, context: int, kv_at) -> list[str]:
    """The sliding-window chapter: at four windows' length (the run's, without windows), the K/V every layer global
    would take and (with windows) what this model's take, its count of local and global layers and the window."""
    window = next((w for w in info.layer_windows if w is not None), None)
    at = min(info.context_limit, 4 * window) if window else context
    every = [f"{at:,}", fmt_size(at * kv_at(1))]  # kv_at(1): one position in every layer
    if window is None:
        return every
    local = sum(w is not None for w in info.layer_windows)
    return every + [fmt_size(kv_at(at)), str(local), str(info.layers - local), str(window)]


def crossovers(info, context: int, kv_at) -> list[str]:
    """Chapter 10: where one step's K/V passes its weights (the embedded model's are tied: all are read), by brute
    force: the batch at this context and at the limit, the context of one request; Qwen3-0.6B's from its card
    (596,049,920 parameters in bfloat16, 114,688 B of K/V per position)."""
    def first(passes):
        return f"{next(x for x in range(1, 10**6) if passes(x)):,}"

    weights, qwen, qwen_kv = info.parameters * info.element_bytes, 596_049_920 * 2, 114_688
    return [first(lambda b: b * kv_at(context) > weights), first(lambda b: b * kv_at(info.context_limit) > weights),
            first(lambda n: kv_at(n) > weights), first(lambda n: n * qwen_kv > qwen),
            first(lambda b: b * context * qwen_kv > qwen), f"{weights / 2**20:,.0f}"]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.key)
def test_every_chapter_opens_from_its_link_in_its_state_with_the_models_numbers(chapter, lang, request):
    # A page in Chinese opens on the Chinese embedded model (Gemma 3 270M), one in English on SmolLM2.
    model = request.getfixturevalue("embedded_model" if lang == "en" else "embedded_zh_model")
    at = start(chapter=chapter.number, lang=lang)
    assert_clean(at)
    state, problems = parse_query(dict(at.query_params.items()))
    assert not problems and state.chapter == chapter.number
    block_size = CASE_BLOCK_SIZE if chapter.case else chapter.settings["block_size"]
    assert (state.view, state.step, state.block_size, state.kv_splits) == (
        chapter.view, chapter.step, block_size, chapter.settings["kv_splits"])
    if chapter.case:
        assert state.prompt == CASES[chapter.case] and not state.chat
    assert strings.t(VIEW_TITLES[chapter.view], lang) in [s.value for s in at.subheader]
    text = lesson_text(at)
    assert chapter.part("title", lang) in text
    assert "{" not in text and "–" not in text  # every placeholder was filled with a number of this step
    missing = [number for number in expected_numbers(chapter, model, lang) if number not in text]
    assert not missing, (missing, text)
    if lang == "zh":
        assert not english_left([text]), english_left([text])


def test_chapters_tell_different_things_and_cover_every_teaching_point():
    bodies = [c.part("body", lang) for c in CHAPTERS for lang in ("en", "zh")]
    assert len(set(bodies)) == len(bodies) and len(CHAPTERS) >= 10
    assert {p for c in CHAPTERS for p in c.points} == {f"T{i}" for i in range(1, 15)}
    for c in CHAPTERS:  # the same placeholders in both languages: a number is never missing in one of them
        for part in ("body", "look", "claim", "question", "answer"):
            names = [set(re.findall(r"{(\w+)", c.part(part, lang))) for lang in ("en", "zh")]
            assert names[0] == names[1], (c.key, part)


@pytest.mark.parametrize("value", ["abc", "99", "-1", "2.5"])
def test_a_malformed_chapter_falls_back_with_a_message(value, embedded_model):
    at = start(chapter=value)
    assert_clean(at)
    assert any("chapter" in w.value for w in at.warning), [w.value for w in at.warning]


def test_a_link_to_a_chapter_with_another_view_opens_the_chapters_view_and_figure(embedded_model):
    """The chapter sets the view (its selector is hidden in the lesson): a hand-edited link naming another view still
    shows the chapter's figure, not an empty place; the link's other values stay."""
    chapter = CHAPTERS[8]  # paging: its figure is the pool, in the paged-KV view
    at = start(chapter=chapter.number, view="flow", step=5)
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step) == (chapter.number, chapter.view, 5)
    assert strings.t(VIEW_TITLES[chapter.view]) in [s.value for s in at.subheader]
    assert at.get("plotly_chart"), "the chapter's figure is drawn"


def test_leaving_the_lesson_keeps_the_page_as_it_is(embedded_model):
    at = start(chapter=9)  # paging: kv view, step 6, blocks of 4
    at.button(key="b_lesson_leave").click().run()
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step, state.block_size) == (0, "kv", 6, 4)
    assert "chapter" not in at.query_params


# -- in a real browser ----------------------------------------------------------------------------------



def chapter_in_link(page, number: int | None) -> None:
    expected = "null" if number is None else f"'{number}'"
    page.wait_for_function(f"() => new URL(location.href).searchParams.get('chapter') === {expected}",
                           timeout=WAIT_MS)
    settled_text(page)


def open_sidebar(page) -> None:
    """The lesson's sidebar (the chapter list, the way out) starts closed: open it as a teacher would (»)."""
    if page.locator('[data-testid="stSidebar"][data-collapsed="true"]').count():
        page.locator('[data-testid="stExpandSidebarButton"]').click()
    expect(page.locator('[data-testid="stSidebar"][data-collapsed="false"]')).to_have_count(1)


def shows_chapter(page, number: int) -> None:
    title = CHAPTERS[number - 1].part("title", "en")
    expect(page.locator("h1").get_by_text(title)).to_be_visible(timeout=WAIT_MS)


@pytest.mark.browser
def test_keys_buttons_and_the_list_move_through_the_chapters(server):
    """A chapter that keeps the sidebar's settings runs the step alone (no sidebar widget is sent: top-p's key);
    the list in the sidebar, drawn before those moves, still goes to any chapter; a chapter with other settings
    (a case, another split count) runs the whole page."""
    with browser_page() as page:
        sent = Received(page)
        page.goto(f"{server}/")
        settled_text(page)
        press(page, "b_lesson_start")
        chapter_in_link(page, 1)
        shows_chapter(page, 1)
        page.locator("h1").first.click()  # focus on the page, not a field, as a presenter's clicker would
        sent.clear()
        page.keyboard.press("PageDown")
        chapter_in_link(page, 2)
        shows_chapter(page, 2)
        assert sent.carries("kv-counter") and not sent.carries("w_top_p")
        page.keyboard.press("PageUp")
        chapter_in_link(page, 1)
        press(page, "b_chapter_next")
        chapter_in_link(page, 2)
        open_sidebar(page)
        page.locator(".st-key-b_toc_1 button").click()  # the chapter the sidebar was last drawn on
        chapter_in_link(page, 1)
        page.locator(".st-key-b_toc_12 button").click()
        chapter_in_link(page, 12)  # the article's Case 1, loaded on entering
        shows_chapter(page, 12)
        params = dict(p.split("=", 1) for p in page.url.split("?", 1)[1].split("&"))
        assert (params["view"], params["block_size"], params["step"]) == ("prefix", "4", "1")
        sent.clear()
        press(page, "b_chapter_back")
        chapter_in_link(page, 11)
        assert "view=split" in page.url and "kv_splits=4" in page.url
        assert sent.carries("w_top_p")
        open_sidebar(page)
        press(page, "b_lesson_leave")
        chapter_in_link(page, None)
        assert "view=split" in page.url and "kv_splits=4" in page.url  # leaving keeps the state
        expect(page.locator(".st-key-b_lesson_start")).to_be_visible()


def test_play_keeps_the_chapter_current_and_the_list_still_moves(embedded_model):
    at = start(chapter=3)
    at.toggle(key="w_playing").set_value(True).run()
    at.run()  # Play's ticks redraw the step with its chapter: the panel quotes the step on screen
    assert_clean(at)
    assert at.query_params["chapter"] == "3" and at.query_params["step"] == "5"
    _, trace = own_trace(embedded_model, default_prompt("en"), 5, 16, 1)
    text = lesson_text(at)
    assert f"{trace.token_id}," in text and f"position {trace.positions[-1]}." in text, text
    at.toggle(key="w_playing").set_value(False).run()
    at.button(key="b_toc_7").click().run()
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert (state.chapter, state.view, state.step) == (7, "attention", 4)


def test_the_tokens_chapter_explains_byte_level_bpe_when_a_character_spans_several_tokens(embedded_model):
    tokenizer = embedded_model.tokenizer
    split = any(len(tokenizer.encode(ch)) > 1 for ch in "解释什么是")  # the tokenizer's own verdict
    assert split  # SmolLM2 splits these characters: the chapter must say why
    at = start(chapter=1, prompt="解释什么是Transformer", chat=0)
    assert strings.t("bpe_explained") in [c.value for c in at.container("chapter").caption]
    plain = start(chapter=1, prompt="Hello there", chat=0)
    assert strings.t("bpe_explained") not in [c.value for c in plain.container("chapter").caption]


def drawn_parts(at) -> tuple[int, int]:
    """Charts and tables (st.table and st.dataframe) on the page, but for the model card's at the foot."""
    card = next(e for e in at.expander if e.label == strings.t("card_title"))
    return len(at.get("plotly_chart")), len(at.table) + len(at.dataframe) - len(card.table) - len(card.dataframe)


def test_the_whole_view_under_a_chapter_is_built_only_once_opened_and_then_stays_open(embedded_model):
    """A chapter draws its own figure, the step's text and its controls; the view's other figures and tables (and
    the costs view's timing, measured when shown) only once the whole view under it is opened, which then stays
    open from chapter to chapter, both ways."""
    at = start(chapter=1)
    closed = {}
    for chapter in CHAPTERS:
        if chapter.number > 1:
            at.button(key="b_chapter_next").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(chapter.number)
        closed[chapter.number] = drawn_parts(at)
        assert sum(closed[chapter.number]) == 1, (chapter.key, closed[chapter.number])  # the chapter's figure alone
        assert strings.t("decode_step") not in [m.label for m in at.metric], chapter.key  # nothing timed
        assert at.code, chapter.key  # the text so far
    at = open_whole_view(at)
    for chapter in reversed(CHAPTERS):
        if chapter.number < len(CHAPTERS):
            at.button(key="b_chapter_back").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(chapter.number)
        charts, tables = drawn_parts(at)
        assert charts >= closed[chapter.number][0] and charts + tables > 1 + sum(closed[chapter.number]), chapter.key
        if chapter.view == "costs":
            assert strings.t("decode_step") in [m.label for m in at.metric], chapter.key  # measured, shown


def test_a_revisited_chapter_reads_the_run_its_first_visit_computed(embedded_model, monkeypatch):
    """PageDown through the lesson, a case included, then PageUp back: every chapter's run is built on its first
    visit only (the store's count of builds does not move on the way back), and shows the same step's token.
    The store of its own (its size is part of its key) has room for them all: this is not about eviction."""
    monkeypatch.setenv("KVSCOPE_SHARED_RUNS_MB", "4321")
    at = start(chapter=9)
    store = at.session_state["runner"].runs
    seen = {}
    for number in range(9, 14):  # 9 … 13: paging, costs, split-KV and both cases
        if number > 9:
            at.button(key="b_chapter_next").click().run()
        assert_clean(at)
        seen[number] = at.query_params["step"], at.session_state["runner"].session.generated[:]
    built = store.built
    for number in range(12, 8, -1):  # back to 9: all visited
        at.button(key="b_chapter_back").click().run()
        assert_clean(at)
        assert at.query_params["chapter"] == str(number)
        assert (at.query_params["step"], at.session_state["runner"].session.generated[:]) == seen[number]
    assert store.built == built


@pytest.mark.parametrize("link", [{}, {"layer": 3, "head": 2}], ids=["focused head", "head from the link"])
def test_the_split_chapter_quotes_the_head_its_figure_shows(link, embedded_model):
    """Issue 18: the panel quoted the maximum over all layers and heads beside a figure of one head. Now it quotes
    the shown head (the view's own pickers and metric say which, and its number), and the maximum, labelled."""
    import math

    chapter = next(c for c in CHAPTERS if c.key == "split_kv")
    at = open_whole_view(start(chapter=chapter.number, **link))
    assert_clean(at)
    layer, head = at.number_input(key="w_layer").value, at.number_input(key="w_head").value
    if link:
        assert (layer, head) == (link["layer"], link["head"])
    _, trace = own_trace(embedded_model, default_prompt("en"), chapter.step, chapter.settings["block_size"],
                         chapter.settings["kv_splits"])
    diffs = (trace.split.merged - trace.split.unsplit).abs().amax(dim=-1)  # (layers, heads)
    shown = f"{diffs[layer, head].item():.1e}"
    assert [m.value for m in at.metric if m.label == strings.t("max_diff")] == [shown]  # the view beside it
    text = lesson_text(at)
    assert f"(layer {layer}, Q head {head}) merged and unsplit differ by at most {shown}" in text, text
    top = int(diffs.argmax())
    where = (top // diffs.shape[1], top % diffs.shape[1])
    if where == (layer, head):
        assert f"{shown}, the largest over all {diffs.shape[0]} layers and {diffs.shape[1]} Q heads." in text, text
    else:
        assert f"the largest is {diffs.max().item():.1e} (layer {where[0]}, Q head {where[1]})" in text, text
    # the view's worked example, computed here by hand: softmax(K q / √2) V over its four keys
    from engine.split_kv import EXAMPLE_KEYS, EXAMPLE_QUERY, EXAMPLE_VALUES

    scores = [sum(k * q for k, q in zip(key, EXAMPLE_QUERY)) / math.sqrt(2) for key in EXAMPLE_KEYS]
    weights = [math.exp(s) / sum(math.exp(x) for x in scores) for s in scores]
    out = [sum(w * v[d] for w, v in zip(weights, EXAMPLE_VALUES)) for d in range(2)]
    assert f"unsplit [{out[0]:.3f}, {out[1]:.3f}]" in text and "example in the whole view below is our own" in text, text
