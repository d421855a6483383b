"""What a page's views compute beside its run, each kept in the server's run store (`Runner.store`) for every page
with the same settings: one token in two contexts, the eviction pair and its forced reading, StreamingLLM's
experiment, the Serving view's class and the speculative view's run. `Runner` opens them through this base."""

from __future__ import annotations

from collections.abc import Callable

import engine
from engine.context_kv import TokenInContexts, token_in_contexts
from engine.prompt import word_end
from ui.host.limits import Limits
from ui.runs.eviction import EvictionPair, pair_for
from ui.runs.eviction_forced import ForcedReading, forced_reading
from ui.runs.eviction_settings import EvictionSettings
from ui.runs.run import RunConfig
from ui.runs.serving import ServedClass, served_for, serving_setup
from ui.runs.sink_experiment import SinkExperiment
from ui.runs.speculative import SpeculativeRun, run_for, setup_for
from ui.runs.store import RunStore


class Experiments:
    """A `Runner`'s experiments beside its run, and what they read of it (set by `Runner`)."""

    model: engine.Model
    prompt_ids: list[int]
    config: RunConfig | None
    limits: Limits
    store: RunStore

    def token_in_contexts(self, first: str, second: str, word: str) -> TokenInContexts:
        """The last token of `word` in two sentences, each read as a prompt without a chat template: its K and V in
        every layer of both (`engine.context_kv`), computed once for every page on this model (the store's entry).
        Raises InvalidSettingError where `word` is missing from a sentence or ends on different ids in the two."""

        def build() -> TokenInContexts:
            (a, i), (b, j) = (word_end(self.model, text, word) for text in (first, second))
            return token_in_contexts(self.model, a, i, b, j)

        info = self.model.info
        return self.store.get(("contexts", info.name, info.dtype, first, second, word), build)

    def eviction_pair(
        self, settings: EvictionSettings, step: int, progress: Callable[[int], None] | None = None
    ) -> tuple[EvictionPair, int]:
        """The full cache's run and the policy's on this run's prompt (`ui.runs.eviction`: from the lab of the
        settings' timing, which every page shares), advanced to `step` answer tokens; and the passes both have.
        `progress(passes)` is told as the lab catches up. Raises InvalidSettingError where the settings cannot run."""
        pair = pair_for(
            self.store,
            self.model,
            list(self.prompt_ids),
            settings,
            self.limits.max_new_tokens,
            self.limits.step_memory_mb,
        )
        passes = pair.advance_to(max(step, 1), progress)
        self.store.trim()  # the lab may have grown past the store's bytes: older runs go first
        return pair, passes

    def forced_reading(self, answer: list[int], settings: EvictionSettings) -> ForcedReading:
        """`answer` read through the full cache and through the one `settings` keep (`compute` it before reading),
        shared by every page of the server's store."""
        return forced_reading(self.store, self.model, list(self.prompt_ids), answer, settings)

    def sink_experiment(self, lang: str) -> SinkExperiment:
        """StreamingLLM's experiment on this model and `lang`'s text (`ui.runs.sink_experiment`), one for every page on
        this model; compute it with its `compute` (long: the caller shows progress)."""
        info = self.model.info
        return self.store.get(("sinks", info.name, info.dtype, lang), lambda: SinkExperiment(self.model, lang))

    def serving(self, state, served_round=None) -> ServedClass:
        """The Serving view's class of requests (`ui.runs.serving`): a round of the class's questions the teacher
        served (`served_round`, `ui.follow.class_prompts.ServedRound`: in the class's language) topped up with
        sample questions, or the samples alone in the page's language, wrapped as this page's prompt is (its chat
        switch), served from a pool of `serve_blocks` blocks (of `ui.runs.serving.BLOCK_SIZE` tokens), at most
        `serve_seqs` requests a step (`state`: the page's `AppState`); one for every page with the same, from the
        store. Raises `PoolTooSmall` where the pool could not hold the longest request alone."""
        lang, texts = (served_round.lang, served_round.texts) if served_round else (state.lang, ())
        setup = serving_setup(self.model, lang, self.config.chat, state.serve_blocks, state.serve_seqs, texts)
        served = served_for(self.store, self.model, setup)
        self.store.trim()
        return served

    def speculative(self, state) -> SpeculativeRun:
        """The speculative view's run of the link's settings (`ui.runs.speculative`), one for every page with the same.
        Raises InvalidSettingError for a draft setting the model cannot take (n past its layers)."""
        setup = setup_for(self.model, state, self.config.chat, self.config.prompt, self.config.sampling)
        return run_for(self.store, self.model, setup)
