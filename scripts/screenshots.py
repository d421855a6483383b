"""Screenshots of the first screen of every view: a projector (1280×720) with and without large text, English and
Chinese, and a phone (390×844), from a running server.

    HF_HUB_OFFLINE=1 streamlit run app.py --server.port 8599 &
    python scripts/screenshots.py http://localhost:8599 /tmp/kvscope-shots            # every shot (~28)
    python scripts/screenshots.py http://localhost:8599 /tmp/kvscope-shots attention  # only these views
    python scripts/screenshots.py http://localhost:8599 /tmp/kvscope-shots chapter:12-15  # lesson chapters

Files are named `{view}-{lang}-{1280x720|1280x720-large|390x844}.png`; each shows what a viewer sees without
scrolling (step 8, the page's defaults otherwise). A chapter is shot as the lesson opens it, on each language's
own model (English: SmolLM2, Chinese: Gemma 3 270M): `chapter{n}-{lang}-{suffix}.png`, the projector with large text
and a phone as a student opens it. Needs Debian's chromium and the playwright package (see .ci/run).
"""

import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ui.state.link import LANGS, VIEWS  # noqa: E402

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PROJECTOR = {"width": 1280, "height": 720}
PHONE = {"width": 390, "height": 844}
# (viewport, large text, file suffix, views): the phone shows two views, enough to judge its layout.
SCREENS = (
    (PROJECTOR, False, "1280x720", VIEWS),
    (PROJECTOR, True, "1280x720-large", VIEWS),
    (PHONE, False, "390x844", ("attention", "kv")),
)


def shoot(page, link: str, shown: str, path: Path) -> None:
    """Open `link`, wait until the page has finished its run and shows `shown`, then save the first screen."""
    page.goto(link)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    page.wait_for_selector(shown, timeout=120_000)
    time.sleep(2)  # let Plotly finish drawing
    page.screenshot(path=str(path))
    print(path)


def main(base: str, folder: str, views: tuple[str, ...] = VIEWS) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    chapters = [spec.removeprefix("chapter:") for spec in views if spec.startswith("chapter:")]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for spec in chapters:
            first, _, last = spec.partition("-")
            for viewport, large, suffix in ((PROJECTOR, True, "1280x720-large"), (PHONE, False, "390x844")):
                page = browser.new_page(viewport=viewport)
                for lang in LANGS:
                    for number in range(int(first), int(last or first) + 1):
                        link = f"{base}/?chapter={number}&lang={lang}" + ("&large=1" if large else "")
                        shoot(page, link, ".st-key-chapter-figure", out / f"chapter{number}-{lang}-{suffix}.png")
                page.close()
        for viewport, large, suffix, screen_views in SCREENS if not chapters else ():
            page = browser.new_page(viewport=viewport)
            for lang in LANGS:
                for view in (v for v in screen_views if v in views):
                    link = f"{base}/?step=8&view={view}&lang={lang}" + ("&large=1" if large else "")
                    # the Serving view shows its requests' texts, not the run's
                    shown = ".st-key-main-figure" if view == "serving" else ".st-key-generated code"
                    shoot(page, link, shown, out / f"{view}-{lang}-{suffix}.png")
            page.close()
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], tuple(sys.argv[3:]) or VIEWS)
