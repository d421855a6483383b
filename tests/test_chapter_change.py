"""A chapter change leaves nothing of the last chapter's figure on a teacher's page (headless Chromium, 1280×720).

A teacher's page runs a timed fragment (its room's heartbeat, `KVSCOPE_LEAD_S`). When that fragment's run started
as a chapter's run ended, Streamlit left the elements the old chapter had past the new one's last: the KV chapter
showed the GQA chapter's chart under its own, pushed below the projector's first screen (CI, and 7 of 40 chapter
changes here with a 0.1 s heartbeat). The step's places now change slot with the chapter
(`ui.page.step_layout.fresh_place`).

The heartbeat's request also carries the browser's copy of every widget, which Streamlit takes over the page's: a
tick sent while the paging chapter's run was under way carried the chapter before's blocks of 16 (the sidebar's
block size), and the page went on in the paging chapter with them (its text said "blocks of 16", CI; here, with
two busy processes beside it, in the 2nd to 12th round of 9 ↔ 10). The page now puts such echoes back
(`ui.page.page_state.undo_stale_echoes`).

This server's heartbeat is 0.1 s, so that a chapter change meets a tick in most walks.
"""

import pytest

from tests.helpers import link, until_link, widget
from tests.server import running_server
from ui.lesson.chapters import CHAPTERS

pytestmark = pytest.mark.browser

# The attention, GQA, KV, two-contexts and paging chapters: each chapter's figure is one chart, each differs from its
# neighbours', and the paging chapter sets blocks of 4 and the busy pool where the others have the defaults.
WALK = [
    ("PageDown", 7),
    ("PageDown", 8),
    ("PageDown", 9),
    ("PageDown", 10),
    ("PageUp", 9),
    ("PageDown", 10),
    ("PageUp", 9),
    ("PageUp", 8),
    ("PageUp", 7),
    ("PageUp", 6),
]
ROUNDS = 4
SETTINGS = ("block_size", "pool")  # what the paging chapter sets, in its link and (the block size) in the sidebar


@pytest.fixture(scope="module")
def fast_heartbeat_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("fast-heartbeat") / "server.log"
    with running_server(log, env={"KVSCOPE_LEAD_S": "0.1"}) as (url, _):
        yield url


def test_a_chapter_change_shows_only_the_new_chapter_and_its_settings(fast_heartbeat_server, page):
    """Each arrival, once the next ticks have run: one chart in the figure's place, and the chapter's own settings in
    its link and the sidebar."""
    page.goto(f"{fast_heartbeat_server}/?lang=zh&large=1&lead=1&chapter=6")
    until_link(page, chapter="6")
    wrong = []
    for round_ in range(ROUNDS):
        for key, number in WALK:
            page.keyboard.press(key)
            until_link(page, chapter=str(number))
            page.wait_for_timeout(300)  # the next ticks have run: a leftover or an echo would be there
            charts = page.locator(".st-key-chapter-figure .js-plotly-plot").count()
            own = CHAPTERS[number - 1].settings
            expected = {name: str(own[name]) if number == 10 else None for name in SETTINGS}
            shown = {name: link(page).get(name) for name in SETTINGS}
            size = widget(page, "w_block_size").locator("input").input_value()
            if charts != 1 or shown != expected or size != str(own["block_size"]):
                wrong.append((round_, number, charts, shown, size))
    assert wrong == []  # (round, chapter, charts in its figure's place, its link's settings, the sidebar's block size)
