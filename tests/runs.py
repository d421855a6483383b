"""Running a generation in tests: one helper, so every test drives the engine the same way."""

import engine


def decode(model, prompt, steps: int | None = None, **options) -> tuple[engine.Generation, list[engine.StepTrace]]:
    """A generation on `prompt` (options go to Generation): the prefill, then `steps` decode steps, or until the
    run stops when `steps` is None. Returns the open generation and its traces."""
    generation = engine.Generation(model, prompt, **options)
    traces = [generation.prefill()]
    while not generation.finished and (steps is None or len(traces) <= steps):
        traces.append(generation.step())
    return generation, traces
