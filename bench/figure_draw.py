"""What the browser does with each view's figures: Plotly's drawing of a figure the first time (newPlot) and of the
next step's figure in its place (react, what a press makes every page do), per figure, in headless Chromium.

    HF_HUB_OFFLINE=1 python bench/figure_draw.py [--views flow,attention] [--repeats 15]

The figures are the ones the page builds (AppTest, the embedded model, about 200 cached tokens, large text), at
step 8 and step 9; they are drawn 1216 px wide (the projector's page) with the plotly package's plotly.js, close to
the one Streamlit bundles. Medians of `--repeats` draws. Run by hand, not in CI; to compare two checkouts, run
each one's copy of this file in turn (or interleaved), in the same minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plotly  # noqa: E402
import plotly.io  # noqa: E402

from bench.figure_wire import page_figures  # noqa: E402
from tests.server import chromium  # noqa: E402
from ui.state.link import VIEWS  # noqa: E402

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
DRAW = """async ([first, next, repeats]) => {
    const place = document.getElementById('figure'), times = {newPlot: [], react: []};
    for (let i = 0; i < repeats; i++) {
        Plotly.purge(place);
        let start = performance.now(), figure = JSON.parse(first);
        await Plotly.newPlot(place, figure.data, figure.layout, {displaylogo: false});
        times.newPlot.push(performance.now() - start);
        start = performance.now();
        figure = JSON.parse(next);
        await Plotly.react(place, figure.data, figure.layout, {displaylogo: false});
        times.react.push(performance.now() - start);
    }
    return times;
}"""


def figures(view: str, step: int) -> list[str]:
    """The JSON of the figures the page draws for `view` at `step` with large text, in the order it builds them."""
    return [plotly.io.to_json(fig, validate=False) for fig in page_figures(view, step, large=1)]


def describe(spec: str) -> str:
    figure = json.loads(spec)
    layout = figure["layout"]
    kinds = sorted({trace["type"] for trace in figure["data"]})
    return (
        f"{len(spec) // 1024:4d} KiB, {len(figure['data']):2d} traces ({'/'.join(kinds) or '-'}), "
        f"{len(layout.get('annotations', [])):2d} annotations, {len(layout.get('shapes', [])):2d} shapes"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--views", default=",".join(VIEWS))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    views = args.views.split(",")
    built = {view: (figures(view, 8), figures(view, 9)) for view in views}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.set_content("<div id='figure' style='width: 1216px'></div>")
        page.add_script_tag(path=str(PLOTLY_JS))
        for view in views:
            total_new = total_react = 0.0
            for number, (first, following) in enumerate(zip(*built[view]), start=1):
                times = page.evaluate(DRAW, [first, following, args.repeats])
                new, react = statistics.median(times["newPlot"]), statistics.median(times["react"])
                total_new, total_react = total_new + new, total_react + react
                print(
                    f"{view:9s} #{number} {describe(first)}: newPlot {new:5.0f} ms, react {react:5.0f} ms", flush=True
                )
            print(f"{view:9s} all: newPlot {total_new:5.0f} ms, react {total_react:5.0f} ms", flush=True)


if __name__ == "__main__":
    main()
