"""The server's memo of built figures: pages showing the same step of the same run build each figure once, and a
figure is built again whenever what it shows changes (step, language, layer, the run itself)."""

import json

import pytest

from tests.app_helpers import assert_clean, start
from ui.views import attention, figures, kv_cache, paint

LINK = dict(view="attention", step=3, layer=5, head=2, chat=0, prompt="The capital of France is")


@pytest.fixture
def builds(monkeypatch):
    """How many times the all-heads chart was built, counted from a clean memo."""
    figures._figures.clear()
    calls = []
    real = attention.head_grid_figure

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "head_grid_figure", counted)
    return calls


def charts(at) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def count_calls(monkeypatch, functions) -> list[str]:
    """The names of `functions` ((module, name) pairs), one entry per call, as the page makes them."""
    built = []
    for module, name in functions:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: built.append(_name) or _real(*a, **k))
    return built


def test_pages_on_the_same_step_of_one_run_build_each_figure_once(builds, embedded_model):
    first = start(**LINK)
    assert_clean(first)
    assert len(builds) == 1
    second = start(**LINK)  # another student's page with the same link shares the run, and its figures
    assert_clean(second)
    assert len(builds) == 1
    assert charts(second) == charts(first)


@pytest.mark.parametrize(
    "change, new_data",
    [
        ({"step": 4}, True),
        ({"layer": 6}, True),
        ({"prompt": "The capital of Italy is"}, True),
        ({"lang": "zh"}, False),  # the words differ: the title is page text
        ({"temperature": 1, "seed": 7}, False),
    ],
)  # another run
def test_a_figure_is_built_again_when_what_it_shows_changes(change, new_data, builds, embedded_model):
    before = start(**LINK)
    after = start(**(LINK | change))
    assert_clean(after)
    assert len(builds) == 2
    if new_data:
        assert charts(after) != charts(before)


def test_back_redraws_a_step_from_the_memo(builds, embedded_model):
    at = start(**LINK)
    at.button(key="b_next").click().run()
    at.button(key="b_back").click().run()
    assert_clean(at)
    assert at.query_params["step"] == "3"
    assert len(builds) == 2  # steps 3 and 4; step 3 again came from the memo
    assert charts(at) == charts(start(**LINK))


def test_a_memoized_figure_is_converted_for_the_wire_once(builds, embedded_model, monkeypatch):
    """Plotly's to_dict (a deep copy and the arrays' encoding) ran for every figure on every draw: drawn again from
    the memo, a figure is sent as the dict made when it was built."""
    from plotly.basedatatypes import BaseFigure

    conversions = []
    real = BaseFigure.to_dict

    def counted(fig):
        conversions.append(type(fig).__name__)
        return real(fig)

    monkeypatch.setattr(BaseFigure, "to_dict", counted)
    first = start(**LINK)
    assert len(conversions) >= len(first.get("plotly_chart")) > 0  # each figure built once, converted once
    conversions.clear()
    second = start(**LINK)
    assert_clean(second)
    assert conversions == []
    assert charts(second) == charts(first)


def test_the_kv_views_figures_come_from_the_memo(embedded_model, monkeypatch):
    """The paged-KV view's figures are memoized like the others': a second page on the same step builds none, the
    next step builds the step's own (not the per-layer lengths, the same at every step), Back none."""
    figures._figures.clear()
    built = count_calls(
        monkeypatch,
        [(kv_cache, name) for name in ("pool_figure", "layer_lengths_figure", "kv_values_figure", "occupancy_bar")],
    )
    link = dict(view="kv", step=3, layer=5, head=2, chat=0, prompt="The capital of France is")
    first = start(**link)
    assert_clean(first)
    assert sorted(built) == ["kv_values_figure", "layer_lengths_figure", "occupancy_bar", "pool_figure"]
    built.clear()
    second = start(**link)
    assert built == []
    assert charts(second) == charts(first)
    second.button(key="b_next").click().run()
    assert_clean(second)
    assert sorted(built) == ["kv_values_figure", "occupancy_bar", "pool_figure"]  # the lengths: the same every step
    built.clear()
    second.button(key="b_back").click().run()
    assert_clean(second)
    assert second.query_params["step"] == "3"
    assert built == []  # Back draws step 3 from the memo


def test_pages_on_the_same_step_build_its_tables_and_token_cells_once(embedded_model, monkeypatch):
    """What every page of a class draws on each step besides the figures (the step's stages and candidates as tables,
    the token cells of the stream and the header) is made once per step for all of them, and shows the same."""
    from ui.runs import run as runs
    from ui.views import flow, stepper

    figures._tables.clear()
    built = count_calls(
        monkeypatch,
        ((flow, "stages_table"), (stepper, "candidates_table"), (runs, "token_cells"), (runs, "candidate_cells")),
    )
    link = dict(view="flow", step=3, chat=0, prompt="Each table is made once")  # a run no other test made
    first = start(**link)
    assert_clean(first)
    assert sorted(set(built)) == ["candidate_cells", "candidates_table", "stages_table", "token_cells"]
    built.clear()
    second = start(**link)  # another student's page on the same step of the same run
    assert_clean(second)
    assert built == []
    assert second.table[0].value.equals(first.table[0].value)
    assert second.dataframe[0].value.equals(first.dataframe[0].value)
    second.button(key="b_next").click().run()  # the next step: its own tables and cells
    assert {"stages_table", "candidates_table", "token_cells", "candidate_cells"} <= set(built)


@pytest.mark.parametrize(
    "view, module_name, names, every_step",
    [
        (
            "kv",
            "kv_cache",
            ("block_table_frame", "kv_bytes_table", "layer_lengths_table"),
            ("block_table_frame", "kv_bytes_table"),
        ),  # the per-layer lengths: the same at every step
        ("split", "split_kv", ("split_table",), ("split_table",)),
        ("costs", "costs", ("steps_table",), ("steps_table",)),
    ],
)
def test_the_views_tables_are_made_once_for_every_page_on_a_step(
    view, module_name, names, every_step, embedded_model, monkeypatch
):
    """The paged-KV, split-KV and costs views' tables, like the figures: a second page on the same step makes none
    and shows the same, the next step makes its own, Back none."""
    import importlib

    module = importlib.import_module(f"ui.views.{module_name}")
    figures._tables.clear()
    built = count_calls(monkeypatch, [(module, name) for name in names])
    link = dict(view=view, step=3, layer=5, head=2, chat=0, prompt=f"The {view} view's tables are made once")
    first = start(**link)
    assert_clean(first)
    assert sorted(built) == sorted(names)
    built.clear()
    second = start(**link)
    assert_clean(second)
    assert built == []
    for mine, theirs in zip(second.dataframe, first.dataframe, strict=True):
        assert mine.value.equals(theirs.value)
    second.button(key="b_next").click().run()
    assert_clean(second)
    assert sorted(built) == sorted(every_step)
    built.clear()
    second.button(key="b_back").click().run()
    assert_clean(second)
    assert built == []


def test_a_step_drawn_from_the_memo_lets_the_browser_paint_its_text_before_the_figures(embedded_model, monkeypatch):
    """Back to a step whose figures are made: they would reach the browser with the step's text, and their drawing
    would hold the text's paint back. The first figure waits until `PAINT_GAP` after the text; no other does."""
    import streamlit as st

    events = count_calls(monkeypatch, [(st, "code"), (st, "plotly_chart")])
    monkeypatch.setattr(paint, "sleep", events.append)  # the waits, in order with the calls
    at = start(**LINK)
    at.button(key="b_next").click().run()
    events.clear()
    at.button(key="b_back").click().run()
    assert_clean(at)
    waits = [e for e in events if isinstance(e, float)]
    assert len(waits) == 1 and 0 < waits[0] <= paint.PAINT_GAP, events
    assert events.index("code") < events.index(waits[0]) < events.index("plotly_chart"), events
