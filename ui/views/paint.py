"""The paint gap: the step's header and text reach the screen before its figures."""

from __future__ import annotations

from contextvars import ContextVar
from time import perf_counter, sleep

from ui.runs import turns

# When the step's header and text were sent (set by the page; read by the run's first figure, `paint_first`).
TEXT_SENT: ContextVar[float | None] = ContextVar("text_sent", default=None)
# Streamlit's frontend applies the messages that arrive together in one render, and Plotly draws a figure in it
# before anything is painted: figures already made (Back, a follower's step) came with the text and held its paint
# back by their drawing (250-400 ms here). Measured on this machine: 40 ms was not always enough, 60-80 were.
PAINT_GAP = 0.06


def paint_first() -> None:
    """Before the step's first figure: the browser has until `PAINT_GAP` after the step's text was sent to paint
    it (a figure built in that time waits no more)."""
    sent = TEXT_SENT.get()
    if sent is None:
        return
    TEXT_SENT.set(None)
    wait = PAINT_GAP - (perf_counter() - sent)
    if wait > 0:
        with turns.aside():  # a follower's turn goes to the next follower meanwhile
            sleep(wait)
