"""The views: the one list of them and where each is drawn. One module per view; each has `render(ctx: ViewContext)`
and draws with Streamlit only. A view's name is its value in the link (`view=`) and its label's string key
(`view_<name>`, ui/text/strings.csv); the lesson's chapters name views the same way (ui/lesson/lesson.toml)."""

from __future__ import annotations

import importlib

from ui.state.link import VIEWS

# The views in the page's order (the link's names, `ui.state.link.VIEWS`): name → the module under ui/views/ that
# draws it.
MODULES = {view: {"kv": "kv_cache", "split": "split_kv"}.get(view, view) for view in VIEWS}
# Views whose step is a run of their own, not the page's tokens: the Serving view's server steps, the speculative
# view's verify passes. Each module has `advance_to(runner, state, step, room)`, `at_end(…)`, `counter_html(ctx)`,
# `details(ctx)` (what goes under the view in the stepper's place: the text so far) and `next_label` (the Next
# button's string).
OWN_STEPS = ("serving", "speculate")


def own_steps(view: str | None):
    """The module of `view` when its step is a run of its own (`OWN_STEPS`), else None."""
    return importlib.import_module(f"ui.views.{MODULES[view]}") if view in OWN_STEPS else None


def render(view: str, ctx) -> None:
    """Draw `view` for the step in `ctx` (a `ui.views.context.ViewContext`)."""
    importlib.import_module(f"ui.views.{MODULES[view]}").render(ctx)
