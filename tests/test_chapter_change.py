"""A chapter change leaves nothing of the last chapter's figure on a teacher's page (headless Chromium, 1280×720).

A teacher's page runs a timed fragment (its room's heartbeat, `KVSCOPE_LEAD_S`). When that fragment's run started
as a chapter's run ended, Streamlit left the elements the old chapter had past the new one's last: the KV chapter
showed the GQA chapter's chart under its own, pushed below the projector's first screen (CI, and 7 of 40 chapter
changes here with a 0.1 s heartbeat). The step's places now change slot with the chapter (`ui.page.step.fresh_place`).
This server's heartbeat is 0.1 s, so that a chapter change meets a tick in most walks.
"""

import pytest

from tests.helpers import until_link
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
