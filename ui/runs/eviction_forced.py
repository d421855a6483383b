"""What a policy's cache makes of the full cache's answer: that answer so far, teacher forced through the cache the
page's eviction settings leave, against the full cache reading it (`engine.eviction.forced_nll`). The lab's KL
compares the two predictions only while their texts agree; this reads one text through both, at any step.

Computed once per model, prompt, settings and step for every page (a run-store entry), under the entry's lock
(`TurnLock`: a page waiting for it gives its turn away) and with the page's turn shared between layers. Plain
Python (no Streamlit).
"""

from __future__ import annotations

import numpy as np

import engine
from engine.eviction import forced_nll
from ui.runs import turns
from ui.runs.eviction_settings import EvictionSettings


class ForcedReading:
    """The full cache's first `len(answer)` answer tokens after `prompt`: `full` and `evicting`, each token's NLL in
    nats (full cache; the settings' cache), filled by `compute`."""

    def __init__(self, model: engine.Model, prompt: list[int], answer: list[int], settings: EvictionSettings):
        self.model, self.prompt, self.answer, self.settings = model, prompt, answer, settings
        self.full: np.ndarray | None = None
        self.evicting: np.ndarray | None = None
        self.lock = turns.TurnLock()

    def compute(self) -> None:
        with self.lock, engine.between_layers(turns.share):
            if self.evicting is not None:
                return
            s = self.settings
            one_pass = s.at == "prefill"  # both read alike: in bfloat16 two ways of reading round apart
            self.full = forced_nll(self.model, self.prompt, self.answer, one_pass=one_pass).numpy()
            self.evicting = forced_nll(
                self.model,
                self.prompt,
                self.answer,
                s.engine_policy(len(self.prompt) - 1),
                compression_ratio=s.ratio if one_pass else 0.0,
                budget=s.engine_budget(),
                one_pass=one_pass,
            ).numpy()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.full, self.evicting) if a is not None) + 8 * (
            len(self.prompt) + len(self.answer)
        )


def forced_reading(
    store, model: engine.Model, prompt: list[int], answer: list[int], settings: EvictionSettings
) -> ForcedReading:
    """The reading for these settings, from `store` (one for every page); `compute` it before reading."""
    key = ("forced", id(model), tuple(prompt), tuple(answer), settings)
    return store.get(key, lambda: ForcedReading(model, prompt, answer, settings))
