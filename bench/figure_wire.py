"""What `st.plotly_chart` does to draw an already built figure again (Back, a revisited chapter, every page of a
class on one step), per view: the figure to a dict, then to JSON. Plotly's own figure (`to_dict` deep-copies and
encodes it every time) against `ui.views.wire.FrozenFigure` (its dict made once, when it was built).

    HF_HUB_OFFLINE=1 python bench/figure_wire.py [--repeats 20]

Opens each view headless (AppTest, the embedded model, about 200 cached tokens), takes the figures the page built
from the server's memo and times, the two kinds one after the other in one run, the CPU time of the same conversion
`st.plotly_chart` makes. CPU time: the figures hold while the machine is busy with other work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plotly.graph_objects as go  # noqa: E402
import plotly.io  # noqa: E402
import plotly.tools  # noqa: E402

from tests.app_helpers import start  # noqa: E402
from ui.state.link import VIEWS  # noqa: E402
from ui.views import figures  # noqa: E402

PROMPT = " ".join(["token"] * 190)


def wire_ms(fig: go.Figure, repeats: int) -> float:
    """Median CPU ms of what st.plotly_chart does with `fig` before the proto is sent."""
    times = []
    for _ in range(repeats):
        start_s = time.process_time()
        plotly.io.to_json(plotly.tools.return_figure_from_figure_or_data(fig, validate_figure=True), validate=False)
        times.append(1000 * (time.process_time() - start_s))
    return statistics.median(times)


def page_figures(view: str, step: int = 8, **link) -> list[go.Figure]:
    """The figures a page opened on `view` at `step` (about 200 cached tokens; `link`: more of its link) builds,
    in the order it builds them, as the server's memo holds them."""
    figures._figures.clear()  # noqa: SLF001 — the figures this page builds
    start(view=view, prompt=PROMPT, chat=0, step=step, temperature=1, seed=3, **link)
    return [fig for _, fig in figures._figures.values()]  # noqa: SLF001


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for view in VIEWS:
        shown = page_figures(view)
        plain = [go.Figure(fig.to_dict()) for fig in shown]  # the same figures as Plotly builds them
        before = sum(wire_ms(fig, args.repeats) for fig in plain)
        after = sum(wire_ms(fig, args.repeats) for fig in shown)
        kib = sum(len(plotly.io.to_json(fig, validate=False)) for fig in shown) / 1024
        print(
            f"{view:9s} {len(shown)} memoized figures, {kib:6.0f} KiB: "
            f"to the wire {before:6.1f} ms → {after:5.1f} ms of CPU per draw",
            flush=True,
        )


if __name__ == "__main__":
    main()
