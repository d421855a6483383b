"""StreamingLLM's experiment, live on the loaded model (the eviction view's streaming part): the start of a text of
ours read through a cache of `CACHE` positions, the latest alone or with 1, 2, 4 or 8 first positions kept as sinks,
each with the positions its keys were rotated at and with positions inside the cache (the paper's numbering),
against the full cache: the NLL of every next token (`engine.eviction.stream_nll`).

Computed once per model and language for every page (a run-store entry), one configuration after another, under
the entry's lock (`TurnLock`: a page waiting for it gives its turn away) and with the page's turn shared between
layers and configurations, so a class's presses go on meanwhile. Plain Python (no Streamlit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import engine
from engine.eviction import StreamingWindow, stream_nll
from ui.runs import turns

CACHE = 64  # positions a pass reads at most, sinks included: every configuration holds the same bytes
TEXT_TOKENS = 320  # the text's first tokens: 256 passes past the cache, about 9 s on SmolLM2 on one core
TEXTS = Path(__file__).parents[1] / "text" / "texts"  # one-token-at-a-time.<lang>.txt


@dataclass(frozen=True)
class Config:
    sinks: int  # first positions always kept; the latest CACHE − sinks with them
    inside: bool  # positions numbered inside the cache (with no sinks the same as without: not run twice)


# The chapter's story first (a window alone, then four sinks), then the other counts.
CONFIGS = (
    Config(0, False),
    Config(4, False),
    Config(4, True),
    Config(1, False),
    Config(1, True),
    Config(2, False),
    Config(2, True),
    Config(8, False),
    Config(8, True),
)
SINKS = sorted({c.sinks for c in CONFIGS})


class SinkExperiment:
    """The experiment on one model and one language's text: `full` and `nll[config]`, (TEXT_TOKENS − 1,) NLL in
    nats by position (entry p: the pass at p predicting the token after it), filled by `compute`."""

    def __init__(self, model: engine.Model, lang: str):
        self.model = model  # held: the store's key names it, and it must stay the one computed with
        text = (TEXTS / f"one-token-at-a-time.{lang}.txt").read_text(encoding="utf-8")
        self.ids = model.tokenizer(text)["input_ids"][:TEXT_TOKENS]  # as the tokenizer encodes it (Gemma: BOS)
        self.full: np.ndarray | None = None
        self.nll: dict[Config, np.ndarray] = {}
        self.lock = turns.TurnLock()

    @property
    def done(self) -> bool:
        return self.full is not None and len(self.nll) == len(CONFIGS)

    def compute(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Every configuration not computed yet; `progress(done, total)` before each."""
        with self.lock, engine.between_layers(turns.share):
            total = len(CONFIGS) + 1
            if self.full is None:
                if progress is not None:
                    progress(0, total)
                self.full = stream_nll(self.model, self.ids).numpy()
            for done, config in enumerate(CONFIGS, start=1):
                if config in self.nll:
                    continue
                turns.share()
                if progress is not None:
                    progress(done, total)
                window = StreamingWindow(config.sinks, CACHE - config.sinks)
                self.nll[config] = stream_nll(self.model, self.ids, window, rerotate=config.inside).numpy()

    def of(self, sinks: int, inside: bool = False) -> np.ndarray:
        """The NLL by position with `sinks` sinks (numbered inside the cache or not)."""
        return self.nll[Config(sinks, inside and sinks > 0)]

    @staticmethod
    def after_cache(nll: np.ndarray) -> float:
        """The mean over the passes that no longer read every position (past position CACHE)."""
        return float(nll[CACHE + 1 :].mean())

    @property
    def nbytes(self) -> int:
        arrays = [a for a in (self.full, *self.nll.values()) if a is not None]
        return sum(a.nbytes for a in arrays) + 8 * len(self.ids)
