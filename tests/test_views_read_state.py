"""What a session keeps, and the layer and head pickers: they open on a focused head, set by the step before any view
gets its state. (What views may read at all: tests/test_view_protocol.py.)"""

from pathlib import Path

from tests.app_helpers import assert_clean, start
from tests.runs import decode
from ui.state.link import default_prompt, language_defaults, parse_query
from ui.views import MODULES
from ui.views.widgets import HEAD_VIEWS
from viz.attention import focused_head

VIEWS_DIR = Path(__file__).resolve().parent.parent / "ui" / "views"
WIDGET_PREFIXES = ("w_", "p_", "v_", "b_", "x_")  # a widget's key says what it is (ui/state/session.py)


def test_the_session_holds_its_widgets_and_three_typed_states(embedded_model):
    """Besides its widgets' keys, a session keeps one dataclass per concern (ui/state/session.py): a step, a view, a
    chapter with an article's case and a move back out of the lesson leave no other key behind."""
    at = start(step=2, view="attention")
    at.button(key="b_next").click().run()
    at.radio(key="w_view").set_value("kv").run()
    at = start(chapter=4)  # a new session, in the lesson
    at.button(key="b_chapter_next").click().run()
    at.button(key="b_chapter_back").click().run()
    assert_clean(at)
    left = {key for key in at.session_state if not key.startswith(WIDGET_PREFIXES)}
    assert left == {"page", "lesson", "follow"}, sorted(left)


def test_head_views_are_the_views_that_draw_the_layer_and_head_pickers():
    drawing = {
        view
        for view, module in MODULES.items()
        if "layer_head_pickers(" in (VIEWS_DIR / f"{module}.py").read_text(encoding="utf-8")
    }
    assert drawing == HEAD_VIEWS


def test_the_pickers_open_on_a_focused_head_and_other_views_leave_the_link_without_one(embedded_model):
    """A page whose link names no layer or head opens the attention view's pickers on the head `focused_head`
    finds in the prefill's attention (the engine's own, from a run of our own); a view without pickers puts no
    layer or head in the link."""
    at = start(view="costs", step=1)
    assert_clean(at)
    assert "layer" not in at.query_params and "head" not in at.query_params
    at = start(view="attention", step=1)
    assert_clean(at)
    _, traces = decode(embedded_model, default_prompt("en"), 0, chat=language_defaults("en").chat)
    expected = focused_head(traces[0].attention[:, :, -1].float().numpy())
    assert expected != (0, 0)  # else the test could not tell a focused head from the default one
    assert (at.number_input(key="w_layer").value, at.number_input(key="w_head").value) == expected
    link, _ = parse_query(dict(at.query_params))
    assert (link.layer, link.head) == expected
