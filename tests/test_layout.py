"""Layout in headless Chromium, for a projector (1280×720, large text) and a phone (390×844), in English and
Chinese: one page per (language, screen), each view in turn (the first from the link, the others from the view
radio, as a class moves between them), measured for everything that must hold on it:

- on the projector, the Next button and the view's main figure are on the first screen, and the header's step
  counter names the step, its phase and the input position;
- on the phone, Next shows without scrolling sideways, the title is below the header, the step buttons are in one
  row;
- a figure's title is page text that wraps inside its column (a Plotly title never wraps, and was cut: "…3× smaller
  than M"), no legend lies on an axis title or tick labels, and Plotly's toolbar covers no title (issue 18).

Then: a banner under the title leaves it whole; a tapped token shows its hover text on a touch screen. Every lesson
chapter on the projector's first screen, title, Next, figure and labels whole: tests/test_lesson_walk.py.

Needs Debian's chromium and the `playwright` package; `.ci/run` installs both.
"""

import contextlib

import pytest

import engine
from tests.helpers import WAIT_MS, box, until_link
from tests.server import settled_text
from tests.test_serving_view import reference_steps, setup_of
from tests.test_speculative_view import reference_passes
from ui.state.link import VIEWS, default_prompt, parse_query
from ui.text import strings

pytestmark = pytest.mark.browser

PROJECTOR = {"width": 1280, "height": 720}
PHONE = {"width": 390, "height": 844}
FIGURE_SHOWN = 200  # px of the main figure that must be on the first screen
FIGURE_VIEWS = [view for view in VIEWS if view != "costs"]  # the costs view's charts are laid out by issue 18's part 3
SCREENS = [(lang, screen) for lang in ("en", "zh") for screen in ("projector", "phone")]

# What a page's figures get wrong, measured in the page: titles wider than their box or the window, titles still
# drawn by Plotly, legends on an axis's title or tick labels, Plotly's toolbar on a title.
MEASURE = """() => {
  const box = e => e.getBoundingClientRect();
  const meet = (a, b) => a.width > 0 && b.width > 0 && a.left < b.right - 1 && b.left < a.right - 1
                         && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const titles = [...document.querySelectorAll('.kv-figure-title')];
  const out = {titles: titles.length, cut: [], plotly_titles: [], legends: [], toolbars: []};
  for (const t of titles)
    if (t.scrollWidth > t.clientWidth + 1 || box(t).right > innerWidth || box(t).left < 0) out.cut.push(t.textContent);
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    for (const t of plot.querySelectorAll('.gtitle')) if (t.textContent.trim()) out.plotly_titles.push(t.textContent);
    const legend = plot.querySelector('.legend');
    if (legend)
      for (const label of plot.querySelectorAll('.xtitle, .ytitle, .xtick text, .ytick text'))
        if (label.textContent.trim() && meet(box(legend), box(label)))
          out.legends.push(label.textContent + ' under the legend of ' + plot.closest('[data-testid]')?.dataset.testid);
    const bar = plot.querySelector('.modebar');
    if (bar)
      for (const t of titles) if (meet(box(bar), box(t))) out.toolbars.push(t.textContent);
  }
  return out;
}"""


@contextlib.contextmanager
def screen_page(browser, viewport: dict, **options):
    """A page in a fresh context with this viewport (options go to `new_context`)."""
    context = browser.new_context(viewport=viewport, **options)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.mark.parametrize(("lang", "screen"), SCREENS, ids=["-".join(s) for s in SCREENS])
def test_each_view_is_laid_out_for_its_screen(server, browser, lang, screen, request):
    """The projector shows every view with large text; the phone the views with figures. Each view is measured at
    the page's top, as a student who opens it sees it."""
    large = screen == "projector"
    viewport, views = (PROJECTOR, VIEWS) if large else (PHONE, FIGURE_VIEWS)
    # A page in Chinese opens on embedded-zh (Gemma 3 270M), one in English on SmolLM2.
    model = request.getfixturevalue("embedded_model" if lang == "en" else "embedded_zh_model")
    with screen_page(browser, viewport) as page:
        page.goto(f"{server}/?step=8&view={views[0]}&lang={lang}&kv_splits=4" + ("&large=1" if large else ""))
        settled_text(page)
        for view in views:
            if view != views[0]:
                page.locator(".st-key-w_view label", has_text=strings.t("view_" + view, lang)).click()
                until_link(page, view=view, step="8")
                page.evaluate(
                    "() => { window.scrollTo(0, 0); document.querySelector('[data-testid=stMain]').scrollTo(0, 0); }"
                )
            try:
                assert_the_views_radio_clear_of_the_stream(page)
                if view == "serving":
                    assert_server_counter(page, lang, model)
                elif view == "speculate":
                    assert_pass_counter(page, lang, model)
                else:
                    assert_step_counter(page, lang, model)
                if large:
                    assert_next_and_the_main_figure_on_the_first_screen(page)
                else:
                    assert_next_and_the_step_buttons_fit_the_phone(page)
                if view in FIGURE_VIEWS:
                    assert_figures_laid_out(page)
            except AssertionError as error:
                raise AssertionError(f"the {view} view: {error}") from error


def assert_the_views_radio_clear_of_the_stream(page) -> None:
    """The view radio's options sit below the token stream's box (the stream pulls the radio up by Markdown's
    margin, which a radio on two rows filled: its first row lay on the box's border, zh with large text)."""
    if page.locator(".st-key-token-stream").count() == 0:  # the Serving view's requests are its own stream
        return
    stream = box(page, ".st-key-token-stream .kv-stream-box")
    tops = page.evaluate(
        "() => [...document.querySelectorAll('.st-key-w_view label')].slice(1)"
        ".map(label => label.getBoundingClientRect().top)"
    )  # the first label is the radio's own
    assert tops and min(tops) >= stream["y"] + stream["height"] - 1, (stream, tops)


def assert_next_and_the_main_figure_on_the_first_screen(page) -> None:
    assert page.evaluate("window.scrollY") == 0
    next_button, figure = box(page, ".st-key-b_next button"), box(page, ".st-key-main-figure")
    assert next_button["y"] + next_button["height"] <= PROJECTOR["height"], next_button
    assert figure["height"] >= FIGURE_SHOWN, figure
    assert figure["y"] + FIGURE_SHOWN < PROJECTOR["height"], figure


def assert_next_and_the_step_buttons_fit_the_phone(page) -> None:
    """Next on the first screen without scrolling sideways, the title not under the sidebar's button, the four
    step buttons in one row."""
    next_button = box(page, ".st-key-b_next button")
    assert 0 <= next_button["x"] and next_button["x"] + next_button["width"] <= PHONE["width"], next_button
    assert next_button["y"] + next_button["height"] <= PHONE["height"], next_button
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    title, header = box(page, "h1"), box(page, '[data-testid="stHeader"]')
    assert title["y"] >= header["y"] + header["height"], (title, header)
    tops = {round(box(page, f".st-key-{key} button")["y"]) for key in ("b_prefill", "b_back", "b_next", "b_reset")}
    assert len(tops) == 1, tops


def assert_figures_laid_out(page) -> None:
    # Every view draws at least one titled figure (in CI a page's first view once had none yet when measured).
    page.wait_for_selector(".kv-figure-title", timeout=WAIT_MS)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'))"
    )
    found = page.evaluate(MEASURE)
    assert found["titles"] >= 1, found  # every view draws at least one titled figure
    assert not found["cut"] and not found["plotly_titles"], found
    assert not found["legends"] and not found["toolbars"], found


def assert_step_counter(page, lang: str, model) -> None:
    """The header at step 8 of the default prompt: "step 8 · decode · position P" with this step's input and
    output named. Step 1 is the prefill of positions 0…n−1; step k ≥ 2 feeds the token at position n + k − 2."""
    chat = parse_query({"lang": lang})[0].chat  # the language's default (off for the Chinese base model)
    prompt_tokens = len(engine.Generation(model, default_prompt(lang), chat=chat).prompt_ids)
    assert page.locator(".kv-counter").inner_text() == strings.t(
        "counter_decode", lang, step=8, position=prompt_tokens + 6
    )
    header = page.locator(".kv-header").inner_text()
    assert strings.t("io_input", lang) in header and strings.t("io_output", lang) in header


def assert_server_counter(page, lang: str, model) -> None:
    """The Serving view's header at step 8: the server's step 8, its kind and the requests it ran (the engine's own
    `Server` on the view's sample class, tests/test_serving_view.py)."""
    chat = parse_query({"lang": lang})[0].chat
    report = reference_steps(model, setup_of(model, lang, chat))[7]
    key = "serve_counter_prefill" if report.prefill else "serve_counter_decode"
    assert page.locator(".kv-counter").inner_text() == strings.t(key, lang, step=8, n=len(report.ran))


def assert_pass_counter(page, lang: str, model) -> None:
    """The speculative view's header at step 8: its run's pass 8 (or its last), the tokens it and all passes so far
    added (the engine's own generation on the view's code edit, tests/test_speculative_view.py)."""
    chat = parse_query({"lang": lang})[0].chat
    passes = reference_passes(model, lang, chat)[:8]
    assert page.locator(".kv-counter").inner_text() == strings.t(
        "spec_counter", lang, step=len(passes), n=len(passes[-1].added), tokens=sum(len(p.added) for p in passes)
    )


@pytest.mark.parametrize(("viewport", "lang"), [(PROJECTOR, "en"), (PROJECTOR, "zh"), (PHONE, "en")])
def test_a_banner_under_the_title_leaves_the_title_whole(server, browser, viewport, lang):
    """A link's problem shows as a banner between the title and the step: the banner starts below the title's text
    (Streamlit pulls what follows a title up by its Markdown margin; a banner there covered half the title)."""
    with screen_page(browser, viewport) as page:
        page.goto(f"{server}/?step=2&temperature=abc&lang={lang}&large=1")
        settled_text(page)
        title, banner = box(page, "h1"), box(page, '[data-testid="stAlert"]')
        assert banner["y"] >= title["y"] + title["height"], (title, banner)
        header = box(page, ".kv-header")
        assert header["y"] >= banner["y"] + banner["height"], (banner, header)


# -- the lesson on a projector ----------------------------------------------------------------------------------


def test_a_tapped_token_shows_its_position_id_and_bytes_on_a_touch_screen(server, browser):
    """Touch screens have no hover: a tap on a chip shows its hover text in a bar at the foot of the screen."""
    with screen_page(browser, PHONE, has_touch=True, is_mobile=True) as page:
        page.goto(f"{server}/?step=2&view=flow")
        settled_text(page)
        chip = page.locator(".kv-stream-box .kv-tip").last
        chip.tap()
        shown = chip.evaluate("""c => { const after = getComputedStyle(c, '::after');
            return {content: after.content, position: after.position, focused: document.activeElement === c,
                    title: c.getAttribute('title')}; }""")
        assert shown["focused"] and shown["position"] == "fixed", shown
        assert shown["content"] == '"' + shown["title"] + '"', shown  # the tip itself, whole
        assert shown["title"].startswith("position ") and " · id " in shown["title"] and " · bytes " in shown["title"]
