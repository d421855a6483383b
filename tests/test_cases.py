"""The article's prefix-cache cases give the article's result however often and from wherever they are opened:
the Case 1 / Case 2 buttons, a chapter's link, the chapter buttons (PageDown / PageUp), the chapter list. Each
route opens each case 3 times (twice in a browser), between other prompts, steps and the other case; every time
the three policies' verdicts and counts and the first difference must be the rules' results on the tokenizer's own
ids (`tests.test_runner.case_expectation`), never those of the page's earlier copy of the case's edit.
"""

import pytest
from playwright.sync_api import expect

from tests.app_helpers import assert_clean, open_whole_view, start
from tests.helpers import metric_value, open_whole_view_in, press, until_link, widget
from tests.server import browser_page, settled_text
from tests.test_runner import case_expectation
from ui.lesson.chapters import number_of
from ui.text import strings
from ui.views.cases import CASE_BLOCK_SIZE, CASES

REUSE_ORDER = ("whole", "block", "radix")
CASE_OF_CHAPTER = {number_of("prefix_case1"): "case1", number_of("prefix_case2"): "case2"}
ROUNDS = 3
# A browser's routes (the buttons, PageDown / PageUp) go round twice: the second opening of a case is the first that
# can meet the page's earlier copy of its edit. The third round is the AppTest routes' (the same server code).
BROWSER_ROUNDS = 2


def expected_texts(tokenizer, case: str, lang: str = "en") -> dict[str, str]:
    """What the page must show for `case`: per policy its verdict and counts caption, and the first difference."""
    want = case_expectation(tokenizer, case)
    n = len(tokenizer.encode(CASES[case]))
    shown = {"first": str(want["first"])}
    for policy in REUSE_ORDER:
        reused = want[policy]
        shown[policy] = strings.t("verdict_hit" if reused else "verdict_miss", lang)
        shown[policy + "_counts"] = strings.t("policy_counts", lang, reused=reused, computed=n - reused, first=reused)
    return shown


def assert_shows_case(at, tokenizer, case: str, step: int = 1) -> None:
    assert_clean(at)
    link = dict(at.query_params.items())
    assert (link["prompt"], link["chat"], link["block_size"], link["step"], link["view"]) == (
        CASES[case],
        "0",
        str(CASE_BLOCK_SIZE),
        str(step),
        "prefix",
    )
    expected = expected_texts(tokenizer, case)
    metrics = {m.label: m.value for m in at.metric}
    shown = {policy: metrics[strings.t("policy_" + policy)] for policy in REUSE_ORDER}
    assert shown == {policy: expected[policy] for policy in REUSE_ORDER}, case
    assert metrics[strings.t("first_difference")] == expected["first"], case
    captions = [c.value for c in at.caption]
    assert all(expected[policy + "_counts"] in captions for policy in REUSE_ORDER), (case, captions)


# -- every route, headless (AppTest) ------------------------------------------------------------------


def test_the_case_buttons_give_the_articles_result_every_time(embedded_model):
    at = start(view="prefix", step=1)
    tokenizer = embedded_model.tokenizer
    for _ in range(ROUNDS):
        for case in ("case2", "case2", "case1", "case1"):  # each twice in a row, as the repro
            at.button(key=case).click().run()
            assert_shows_case(at, tokenizer, case)
        at.button(key="b_next").click().run()  # the page moves on with the edit …
        at.text_area(key="w_prompt").set_value(CASES["case2"]).run()  # … and a student types the edit itself
        at.button(key="b_next").click().run()
        assert_clean(at)


@pytest.mark.parametrize("chapter", sorted(CASE_OF_CHAPTER))
def test_a_chapters_link_gives_the_articles_result_every_time(chapter, embedded_model):
    for _ in range(ROUNDS):
        assert_shows_case(open_whole_view(start(chapter=chapter)), embedded_model.tokenizer, CASE_OF_CHAPTER[chapter])
    # a link naming its step (a teacher's, a follower's) keeps it: the case is the prompt, not a step
    assert_shows_case(
        open_whole_view(start(chapter=chapter, step=3)), embedded_model.tokenizer, CASE_OF_CHAPTER[chapter], step=3
    )


def test_the_chapter_buttons_give_the_articles_result_every_time(embedded_model):
    """PageDown / PageUp are the buttons' shortcuts: from the chapter before the cases through both to the one after,
    and back, three times (the whole view under each chapter opened once, at the start: it stays open)."""
    case1 = number_of("prefix_case1")
    at = open_whole_view(start(chapter=case1 - 1))
    for _ in range(ROUNDS):
        for key, arrives in (
            ("b_chapter_next", case1),
            ("b_chapter_next", case1 + 1),
            ("b_chapter_next", case1 + 2),
            ("b_chapter_back", case1 + 1),
            ("b_chapter_back", case1),
            ("b_chapter_back", case1 - 1),
        ):
            at.button(key=key).click().run()
            assert_clean(at)
            assert at.query_params["chapter"] == str(arrives)
            if arrives in CASE_OF_CHAPTER:
                assert_shows_case(at, embedded_model.tokenizer, CASE_OF_CHAPTER[arrives])


def test_the_chapter_list_gives_the_articles_result_every_time(embedded_model):
    at = open_whole_view(start(chapter=3))
    for _ in range(ROUNDS):
        for number in (*sorted(CASE_OF_CHAPTER, reverse=True), 3):  # the other case, then another chapter, between
            at.button(key=f"b_toc_{number}").click().run()
            assert_clean(at)
            assert at.query_params["chapter"] == str(number)
            if number in CASE_OF_CHAPTER:
                assert_shows_case(at, embedded_model.tokenizer, CASE_OF_CHAPTER[number])


# -- the button and PageUp routes in a real browser ----------------------------------------------------


def page_shows_case(page, tokenizer, case: str) -> None:
    """Once the link says the case at step 1 and the run has finished: the verdicts, counts and first difference."""
    until_link(page, prompt=CASES[case], chat="0", block_size=str(CASE_BLOCK_SIZE), step="1", view="prefix")
    expected = expected_texts(tokenizer, case)
    for policy in REUSE_ORDER:
        assert metric_value(page, f"verdict_{policy}") == expected[policy], (case, policy)
        expect(widget(page, f"verdict_{policy}")).to_contain_text(expected[policy + "_counts"])
    first = page.locator('[data-testid="stMetric"]', has_text=strings.t("first_difference"))
    expect(first.locator('[data-testid="stMetricValue"]')).to_have_text(expected["first"])


@pytest.mark.browser
def test_the_case_buttons_in_a_browser(server, embedded_model):
    with browser_page() as page:
        page.goto(f"{server}/?view=prefix&step=1")
        settled_text(page)
        for _ in range(BROWSER_ROUNDS):
            for case in ("case2", "case1"):
                press(page, case)
                page_shows_case(page, embedded_model.tokenizer, case)
                press(page, "b_next")  # the link changes before the next press, so its arrival can be awaited
                until_link(page, step="2")
                press(page, case)  # the same case again: its edit is now the page's own earlier prompt
                page_shows_case(page, embedded_model.tokenizer, case)
                press(page, "b_next")
                until_link(page, step="2")


@pytest.mark.browser
def test_page_down_and_page_up_in_a_browser(server, embedded_model):
    """A presenter's clicker: Case 1, PageDown to Case 2 and the chapter after, PageUp back to Case 2 and 1, twice."""
    with browser_page() as page:
        page.goto(f"{server}/?chapter={number_of('prefix_case1')}")
        open_whole_view_in(page)  # once: it stays open from chapter to chapter
        page_shows_case(page, embedded_model.tokenizer, "case1")
        for _ in range(BROWSER_ROUNDS):
            case1 = number_of("prefix_case1")
            for key, arrives in (
                ("PageDown", case1 + 1),
                ("PageDown", case1 + 2),
                ("PageUp", case1 + 1),
                ("PageUp", case1),
            ):
                page.locator("h1").first.click()  # the page has the focus, not a field
                page.keyboard.press(key)
                until_link(page, chapter=str(arrives))
                if arrives in CASE_OF_CHAPTER:
                    page_shows_case(page, embedded_model.tokenizer, CASE_OF_CHAPTER[arrives])
