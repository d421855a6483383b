"""The views: the one list of them and where each is drawn. One module per view; each has `render(ctx: ViewContext)`
and draws with Streamlit only. A view's name is its value in the link (`view=`) and its label's string key
(`view_<name>`, ui/text/strings.csv); the lesson's chapters name views the same way (ui/lesson/lesson.toml)."""

from __future__ import annotations

import importlib

from ui.state.link import VIEWS

# The views in the page's order (the link's names, `ui.state.link.VIEWS`): name → the module under ui/views/ that
# draws it.
MODULES = {view: {"kv": "kv_cache", "split": "split_kv"}.get(view, view) for view in VIEWS}


def render(view: str, ctx) -> None:
    """Draw `view` for the step in `ctx` (a `ui.views.context.ViewContext`)."""
    importlib.import_module(f"ui.views.{MODULES[view]}").render(ctx)
