"""Running a decode session in tests: one helper, so every test drives the engine the same way."""

import engine


def decode(model, prompt, steps: int | None = None, **options) -> tuple[engine.DecodeSession, list[engine.StepTrace]]:
    """A session on `prompt` (options go to DecodeSession): the prefill, then `steps` decode steps, or until the
    run stops when `steps` is None. Returns the open session and its traces."""
    session = engine.DecodeSession(model, prompt, **options)
    traces = [session.prefill()]
    while not session.finished and (steps is None or len(traces) <= steps):
        traces.append(session.step())
    return session, traces
