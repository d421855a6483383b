"""A chapter change leaves nothing of the last chapter's figure on a teacher's page (headless Chromium, 1280×720).

A teacher's page runs a timed fragment (its room's heartbeat, `KVSCOPE_LEAD_S`). When that fragment's run started
as a chapter's run ended, Streamlit left the elements the old chapter had past the new one's last: the KV chapter
showed the GQA chapter's chart under its own, pushed below the projector's first screen (CI, and 7 of 40 chapter
changes here with a 0.1 s heartbeat). The step's places now change slot with the chapter (`ui.page.step.fresh_place`).
This server's heartbeat is 0.1 s, so that a chapter change meets a tick in most walks.
"""

import pytest

from tests.helpers import link, until_link, widget
from tests.server import running_server

pytestmark = pytest.mark.browser

# The attention, GQA and KV chapters: each chapter's figure is one chart, and each differs from its neighbours'.
WALK = [("PageDown", 7), ("PageDown", 8), ("PageUp", 7), ("PageUp", 6)]
ROUNDS = 6


@pytest.fixture(scope="module")
def fast_heartbeat_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("fast-heartbeat") / "server.log"
    with running_server(log, env={"KVSCOPE_LEAD_S": "0.1"}) as (url, _):
        yield url


def test_a_chapter_change_shows_only_the_new_chapters_figure(fast_heartbeat_server, page):
    page.goto(f"{fast_heartbeat_server}/?lang=zh&large=1&lead=1&chapter=6")
    until_link(page, chapter="6")
    left = []
    for round_ in range(ROUNDS):
        for key, number in WALK:
            page.keyboard.press(key)
            until_link(page, chapter=str(number))
            page.wait_for_timeout(300)  # the next ticks have run: a leftover would still be there
            charts = page.locator(".st-key-chapter-figure .js-plotly-plot").count()
            if charts != 1:
                left.append((round_, number, charts))
    assert left == []  # (round, chapter, charts in its figure's place)


# The two-contexts chapter and the paging chapter: the paging chapter sets blocks of 4 and the busy pool, the one
# before it the defaults (blocks of 16, the run's own pool), so each change is a run of the whole page.
ECHO_WALK = [("PageDown", 10), ("PageUp", 9)]
PAGING = {"block_size": "4", "pool": "busy"}
ECHO_ROUNDS = 10  # with two busy processes beside it, the page before the fix failed in the 2nd to 12th round


def test_a_heartbeat_sent_before_a_chapter_arrived_does_not_take_its_settings_back(fast_heartbeat_server, page):
    """The heartbeat's request carries the browser's copy of every widget, which Streamlit takes over the page's: a
    tick sent while the paging chapter's run was under way carried the chapter before's blocks of 16 (the sidebar's
    block size), and the page went on in the paging chapter with them (its text said "blocks of 16", seen in CI).
    Each arrival is checked once the next ticks have run: its link, the sidebar's block size, the chapter's text."""
    page.goto(f"{fast_heartbeat_server}/?large=1&lead=1&chapter=9")
    until_link(page, chapter="9")
    wrong = []
    for round_ in range(ECHO_ROUNDS):
        for key, number in ECHO_WALK:
            page.keyboard.press(key)
            until_link(page, chapter=str(number))
            page.wait_for_timeout(300)  # the next ticks have run: an echo would have taken the settings back
            expected = PAGING if number == 10 else {name: None for name in PAGING}
            shown = {name: link(page).get(name) for name in PAGING}
            size = widget(page, "w_block_size").locator("input").input_value()
            said = f"blocks of {expected['block_size']} positions" in page.locator(".st-key-chapter").inner_text()
            if shown != expected or size != (expected["block_size"] or "16") or number == 10 and not said:
                wrong.append((round_, number, shown, size, said))
    assert wrong == []  # (round, chapter, its link's settings, the sidebar's block size, its text says them)
