"""What a figure costs on the wire to every page that shows it: its dict made once (`FrozenFigure`), its numbers as
float32 (`compact`)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go


class FrozenFigure(go.Figure):
    """A finished figure whose dict, what `st.plotly_chart` sends, is made once. Plotly's `to_dict` deep-copies
    the whole figure and encodes its arrays on every call: most of the time a page took to draw a memoized figure
    again (Back, a chapter revisited, every page of a class on one step). The dict is shared by the pages that show
    the figure and only read: Streamlit serialises it as it is (trace ids, which Plotly's to_json would pop from
    it, are taken out here)."""

    def __init__(self, fig: go.Figure):
        super().__init__()  # an empty figure: this one is only ever read through to_dict
        shown = fig.to_dict()
        for trace in shown["data"]:
            trace.pop("uid", None)
        self._shown = shown

    def to_dict(self) -> dict:
        return self._shown


def compact(fig: go.Figure) -> None:
    """Send a figure's numbers as float32 (Plotly encodes numpy arrays as typed binary arrays): half the bytes of
    float64 over the wire to every student's browser, and still 7 significant digits, more than any hover shows."""
    for trace in fig.data:
        for name in ("x", "y", "z", "customdata"):
            values = trace[name] if name in trace else None
            if isinstance(values, np.ndarray) and values.dtype == np.float64:
                trace[name] = values.astype(np.float32)
