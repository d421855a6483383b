"""The picture of one step (viz.step_picture): every labelled shape is the shape of the tensor the engine made
(read from the trace, the pool and the weights, not from the model card), the lesson's stage is the only one
highlighted, and the flow view shows it in English and Chinese."""

import json
import re

import pytest

import engine
from tests.app_helpers import assert_clean, start
from tests.runs import decode
from tests.test_app import english_left, figure_strings
from ui import strings
from viz.step_picture import FRAME, HIGHLIGHT, STAGES, step_figure

PROMPT = "Paged blocks hold K and V"


@pytest.fixture(scope="module")
def runs(tiny_model, embedded_model):
    """family → (model, open session, traces): the prefill and two decode steps."""
    made = {}

    def run(family: str):
        if family not in made:
            model = embedded_model if family == "embedded" else tiny_model(family)
            session, traces = decode(model, PROMPT, 2, block_size=4, sampling=engine.Sampling(temperature=1.0, seed=3))
            made[family] = model, session, traces
        return made[family]

    yield run
    for _, session, _ in made.values():
        session.close()


def shapes_in(text: str) -> list[tuple[int, ...]]:
    """Every parenthesised shape in a label: "(1, 1536) → (1, 576)" → [(1, 1536), (1, 576)]; "Q (1, 9×64)" →
    [(1, 9, 64)] (heads × head_dim read as two sizes)."""
    return [tuple(int(n) for n in re.split(r"[,×]", group) if n.strip())
            for group in re.findall(r"\(([\d,× ]+)\)", text)]


def shape_labels(fig) -> dict[str, list[str]]:
    """flow row key → the texts of the labels that show its shape."""
    labels: dict[str, list[str]] = {}
    for a in fig.layout.annotations:
        if a.name and ":shape:" in a.name:
            labels.setdefault(a.name.split(":shape:")[1], []).append(a.text)
    return labels


def texts_of(fig, stage: str) -> str:
    return " ".join(a.text for a in fig.layout.annotations if a.name == stage and a.text)


@pytest.mark.parametrize("family", ["embedded", "gpt2", "qwen3"])
@pytest.mark.parametrize("index", [0, 2], ids=["prefill", "decode"])
def test_labelled_shapes_are_the_shapes_of_the_engine_tensors(runs, family, index):
    model, session, traces = runs(family)
    trace = traces[index]
    weights = model.weights
    t = len(trace.input_ids)
    hidden = weights.embed_tokens.shape[1]
    per_token_kv = tuple(session.pool.k.shape[-2:])  # (kv_heads, head_dim) as the pool stores each position
    labels = shape_labels(step_figure(trace, model.info))

    assert shapes_in(labels["ids"][0]) == [(t,)]
    assert shapes_in(labels["embed"][0]) == [(t, hidden)]
    assert ("positions" in labels) == (weights.position_embeddings is not None)  # GPT-2's learned rows
    if weights.position_embeddings is not None:
        assert shapes_in(labels["positions"][0]) == [(t, weights.position_embeddings.shape[1])]
    (q,) = shapes_in(labels["q"][0])
    assert q[0] == t and q[1] * q[2] == weights.layers[0].q_proj.weight.shape[0] and q[2] == per_token_kv[1]
    write, read = labels["write_kv"][0], labels["read_kv"][0]
    assert shapes_in(write) == [per_token_kv] and write.startswith(f"+{t} ×")
    assert shapes_in(read) == [per_token_kv] and read.startswith(f"{trace.positions[-1] + 1} ×")
    assert shapes_in(labels["mlp"][0]) == [(t, weights.layers[0].up_proj.weight.shape[0]), (t, hidden)]
    assert all(shapes_in(text)[-1] == tuple(trace.final_hidden.shape) for text in labels["final_norm"])
    assert shapes_in(labels["lm_head"][0]) == [tuple(trace.logits.shape)]
    assert shapes_in(labels["next_input"][0]) == [tuple(trace.next_input_embedding.shape)]


@pytest.mark.parametrize("index", [0, 2], ids=["prefill", "decode"])
def test_the_picture_shows_the_steps_own_values(runs, embedded_model, index):
    _, _, traces = runs("embedded")
    trace = traces[index]
    fig = step_figure(trace, embedded_model.info)
    layers = len(embedded_model.weights.layers)
    assert str(trace.input_ids[0]) in texts_of(fig, "token_id")
    assert f"position{'s' if index == 0 else ''} {trace.positions[0]}" in texts_of(fig, "token_id")
    assert str(trace.token_id) in texts_of(fig, "sampling")
    assert embedded_model.tokenizer.decode([trace.token_id]).replace(" ", "·") in texts_of(fig, "detokenize")
    assert [int(n) for n in re.findall(r"\d+", texts_of(fig, "residual"))][:3] == [layers, 2, 2 * layers]
    # Prefill: every per-token box is a deck of rows (all prompt tokens at once); decode: one row.
    decks = [s for s in fig.layout.shapes if s.name == "attention" and s.type == "rect"]
    assert len(decks) == (6 if index == 0 else 2)
    assert any(f"({trace.positions[-1]})" in text for text in shape_labels(fig)["final_norm"])  # the one predicting


def lit(fig) -> set[str]:
    """The stages drawn in the highlight colour (boxes, lines, arrow heads)."""
    found = {s.name for s in fig.layout.shapes if s.line.color == HIGHLIGHT}
    return found | {a.name.split(":")[0] for a in fig.layout.annotations if a.showarrow and a.arrowcolor == HIGHLIGHT}


def test_each_stage_is_the_only_one_highlighted(runs):
    model, _, traces = runs("qwen3")
    for trace in (traces[0], traces[1]):
        assert lit(step_figure(trace, model.info)) == set()
        for stage in STAGES:
            fig = step_figure(trace, model.info, stage)
            assert lit(fig) == {stage}, stage
            named = {s.name for s in fig.layout.shapes} | {a.name.split(":")[0] for a in fig.layout.annotations}
            assert named <= set(STAGES) | {FRAME}
    with pytest.raises(ValueError, match="kv_write"):
        step_figure(traces[0], model.info, "kv-write")


def picture_spec(at) -> dict:
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    pictures = [s for s in specs if any(":shape:" in (a.get("name") or "") for a in s["layout"].get("annotations", []))]
    assert len(pictures) == 1, len(pictures)
    return pictures[0]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_flow_view_shows_the_picture_in_the_pages_language(lang, embedded_model):
    at = start(view="flow", step=2, lang=lang)
    assert_clean(at)
    spec = picture_spec(at)
    words = strings.figure_words(lang)
    texts = figure_strings(json.dumps(spec))
    assert any(words["sp_ffn"] in text for text in texts)
    assert HIGHLIGHT not in json.dumps(spec)  # free exploration: no stage is highlighted
    if lang == "zh":
        assert not english_left(texts), english_left(texts)
