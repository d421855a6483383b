"""The picture of one step (viz.step_picture): every labelled shape is the shape of the tensor the engine made
(read from the trace, the pool and the weights, not from the model card), the lesson's stage is the only one
highlighted while the rest stays readable, the picture fits a projector's first screen with no word overlapping
another or leaving its box (drawn by Plotly in headless Chromium), and the flow view shows it in English and
Chinese."""

import base64
import json
import re
from pathlib import Path

import plotly
import pytest
import streamlit

import engine
from tests.app_helpers import assert_clean, start
from tests.runs import decode
from tests.test_app import english_left, figure_strings
from ui.text import strings
from viz.step_drawing import FRAME, HIGHLIGHT
from viz.step_picture import MIN_WIDTH, STAGES, step_figure
from viz.style import contrast_ratio

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
    return [
        tuple(int(n) for n in re.split(r"[,×]", group) if n.strip()) for group in re.findall(r"\(([\d,× ]+)\)", text)
    ]


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
    """The stages drawn in the highlight colour (boxes, lines, arrow heads: filled triangles sized in px)."""
    found = {s.name for s in fig.layout.shapes if s.line.color == HIGHLIGHT}
    return found | {s.name for s in heads(fig) if s.fillcolor == HIGHLIGHT}


def heads(fig) -> list:
    """The arrows' heads: the shapes sized in px, anchored at an arrow's last point."""
    return [s for s in fig.layout.shapes if s.xsizemode == "pixel"]


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


def points(path: str) -> list[tuple[float, float]]:
    """The points of a path "M x,y L x,y …" (closed or not)."""
    return [tuple(map(float, p.split(","))) for p in path.removeprefix("M ").removesuffix(" Z").split(" L ")]


def test_every_arrow_ends_in_a_head_pointing_along_its_last_segment(runs):
    """Each arrow's head sits at its last point with its base behind the tip, on the way the last segment came; the
    highlighted stage's heads are the longer ones."""
    model, _, traces = runs("embedded")
    fig = step_figure(traces[2], model.info, "kv_read")
    lines = [s for s in fig.layout.shapes if s.type == "path" and s.xsizemode != "pixel"]
    heads_at = {(s.xanchor, s.yanchor, s.name): s for s in heads(fig)}
    assert len(heads_at) == len(lines) == len(heads(fig))
    lengths = {True: set(), False: set()}
    for line in lines:
        (tail_x, tail_y), (tip_x, tip_y) = points(line.path)[-2:]
        head = heads_at[(tip_x, tip_y, line.name)]
        tip, (ax, ay), (bx, by) = points(head.path)
        middle_x, middle_y = (ax + bx) / 2, (ay + by) / 2  # px from the tip; x right and y up, as the data's
        assert tip == (0, 0) and (middle_x == 0) == (tip_x == tail_x) and (middle_y == 0) == (tip_y == tail_y)
        assert middle_x * (tip_x - tail_x) <= 0 and middle_y * (tip_y - tail_y) <= 0
        assert head.fillcolor == line.line.color and head.opacity == line.opacity
        lengths[line.name == "kv_read"].add(abs(middle_x) + abs(middle_y))
    assert lengths[True] and min(lengths[True]) > max(lengths[False]) > 0


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


def test_the_picture_fits_a_projectors_first_screen_in_readable_text(runs):
    """At 1280×720 the picture starts about 390 px down: at most 380 px tall with normal text, every word at least
    13 px, and larger with large text."""
    model, _, traces = runs("embedded")
    for trace in (traces[0], traces[2]):
        normal, large = (
            step_figure(trace, model.info, title="Step"),
            step_figure(trace, model.info, title="Step", large=True),
        )
        assert normal.layout.height <= 380, normal.layout.height
        sizes = [a.font.size for a in normal.layout.annotations if a.text]
        large_sizes = [a.font.size for a in large.layout.annotations if a.text]
        assert min(sizes) >= 13, sizes
        assert min(large_sizes) > min(sizes) and all(b >= a for a, b in zip(sizes, large_sizes))


def test_dimmed_parts_stay_readable_while_the_stage_stands_out(runs):
    """On a projector a faint grey vanishes: a dimmed word is dark enough to read on white (WCAG 4.5:1) and a dimmed
    shape keeps at least 0.55 of its colour; the highlighted stage's lines are thicker than the rest."""
    model, _, traces = runs("embedded")
    for stage in ("sampling", "next_input", "kv_read"):
        fig = step_figure(traces[2], model.info, stage)
        for a in fig.layout.annotations:
            if a.text and a.name.split(":")[0] not in (stage, FRAME):
                assert contrast_ratio(a.font.color, "#ffffff") >= 4.5, (a.name, a.font.color)
        dimmed = [s for s in fig.layout.shapes if s.name not in (stage, FRAME)]
        assert dimmed and all(s.opacity >= 0.55 for s in dimmed), stage
        lit_width = min(s.line.width for s in fig.layout.shapes if s.name == stage and s.xsizemode != "pixel")
        assert lit_width > max(s.line.width for s in dimmed), stage


# -- drawn in Chromium: where Plotly puts each word ------------------------------------------------------------

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
APP_FONT = next((Path(streamlit.__file__).parent / "static").rglob("SourceSansVF-Upright*.woff2"))  # the page's font


@pytest.fixture(scope="module")
def plot_page(browser):
    """One page with the app's font and Plotly.js (from the plotly package) loaded once, `MIN_WIDTH` px wide for
    the figure: each test draws its figure anew in it."""
    font = base64.b64encode(APP_FONT.read_bytes()).decode()
    page = browser.new_page(viewport={"width": MIN_WIDTH + 20, "height": 900})
    page.set_content(
        f"<style>@font-face {{font-family: App; src: url(data:font/woff2;base64,{font})}}"
        "body {margin: 0}</style><div id=f></div>"
    )
    page.add_script_tag(path=str(PLOTLY_JS))
    page.evaluate("() => document.fonts.load('13px App')")
    yield page
    page.close()


def drawn_boxes(page, fig, width: int) -> tuple[list[dict], list[dict], dict]:
    """Draw `fig` `width` px wide in the app's font on `plot_page`, in place of the figure before; return (the
    words, the shapes, the figure's rect): words and shapes as {index (into the layout's annotations or shapes),
    rect}, rects as {left, top, right, bottom} in px."""
    spec = fig.to_plotly_json()
    spec["layout"] = {**spec["layout"], "width": width, "font": {**spec["layout"]["font"], "family": "App"}}
    page.evaluate(
        "async spec => { Plotly.purge('f'); await Plotly.newPlot('f', spec.data, spec.layout, {staticPlot: true}); }",
        json.loads(json.dumps(spec, default=str)),
    )
    return page.evaluate("""() => {
        const rect = el => { const r = el.getBoundingClientRect();
                             return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
        const words = [...document.querySelectorAll('g.annotation')].map(g => ({
            index: +g.dataset.index, rect: rect(g.querySelector('text'))})).filter(w => w.rect.right > w.rect.left);
        const boxes = [...document.querySelectorAll('path[data-index]')].map(p => ({
            index: +p.dataset.index, rect: rect(p)}));
        return [words, boxes, rect(document.querySelector('.main-svg'))];
    }""")


def overlap(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (
        min(a["right"], b["right"]) - max(a["left"], b["left"]) > slack
        and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > slack
    )


def inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (
        inner["left"] >= outer["left"] - slack
        and inner["right"] <= outer["right"] + slack
        and inner["top"] >= outer["top"] - slack
        and inner["bottom"] <= outer["bottom"] + slack
    )


def containing_box(fig, annotation, boxes: list[dict]) -> dict | None:
    """The smallest rectangle or circle on the canvas holding the annotation's anchor; of a deck, the front one
    (drawn last)."""

    def holds(box: dict) -> bool:
        shape = fig.layout.shapes[box["index"]]
        return (
            shape.type in ("rect", "circle")
            and shape.x0 <= annotation.x <= shape.x1
            and shape.y0 <= annotation.y <= shape.y1
        )

    def size(box: dict) -> tuple[float, int]:
        shape = fig.layout.shapes[box["index"]]
        return (shape.x1 - shape.x0) * (shape.y1 - shape.y0), -box["index"]

    return min(filter(holds, boxes), key=size, default=None)


@pytest.mark.browser
@pytest.mark.parametrize(
    "family, index", [("embedded", 0), ("embedded", 2), ("gpt2", 0)], ids=["prefill", "decode", "gpt2-prefill"]
)
@pytest.mark.parametrize("large", [False, True], ids=["normal", "large"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_no_word_overlaps_another_or_leaves_its_box(runs, plot_page, family, index, large, lang):
    """At the narrowest width the page gives the picture, every word stays inside the figure and inside the box
    it names, no two words overlap, and no word runs into a box it does not belong to (a deck's rows included)."""
    model, _, traces = runs(family)
    fig = step_figure(
        traces[index],
        model.info,
        title="Step 3 (decode): id 659 in → id 70 out",
        large=large,
        words=strings.figure_words(lang),
    )
    words, boxes, figure = drawn_boxes(plot_page, fig, MIN_WIDTH)
    assert len(words) == len([a for a in fig.layout.annotations if a.text])
    filled = [
        b
        for b in boxes
        if fig.layout.shapes[b["index"]].type in ("rect", "circle") and fig.layout.shapes[b["index"]].name != FRAME
    ]
    for k, word in enumerate(words):
        annotation = fig.layout.annotations[word["index"]]
        assert inside(word["rect"], figure), annotation.text
        home = containing_box(fig, annotation, boxes)
        if home is not None:
            assert inside(word["rect"], home["rect"]), (annotation.text, word["rect"], home["rect"])
        for other in words[k + 1 :]:
            assert not overlap(word["rect"], other["rect"]), (
                annotation.text,
                fig.layout.annotations[other["index"]].text,
            )
        own = [
            b
            for b in filled
            if home is not None
            and overlap(b["rect"], home["rect"])
            and fig.layout.shapes[b["index"]].name == fig.layout.shapes[home["index"]].name
        ]  # its box and its deck
        for box in filled:
            if box not in own:
                assert not overlap(word["rect"], box["rect"], slack=1.5), (
                    annotation.text,
                    fig.layout.shapes[box["index"]].name,
                )


def test_gemma_layers_are_drawn_with_their_four_norms_and_windowed_reads(tiny_model):
    """Gemma 3 normalises each branch's output before its add: the picture says so in its boxes and adds, and its
    cache box says local layers read only their window (the tiny model's window, 8, is shorter than the prompt)."""
    from tests.conftest import GEMMA_WINDOW
    from tests.runs import decode

    model = tiny_model("gemma3")
    _, traces = decode(model, "Paged attention stores the cache in blocks of the pool", 3)
    trace = traces[-1]
    assert trace.context_length > GEMMA_WINDOW
    texts = [a.text for a in step_figure(trace, model.info).layout.annotations]
    assert "x1 = x0 + norm(attention(norm(x0)))" in texts and "x2 = x1 + norm(FFN(norm(x1)))" in texts
    assert "norm →<br>FFN<br>→ norm" in texts and "attention<br>→ o_proj<br>→ norm" in texts
    assert f"read K, V: local layers<br>the last {GEMMA_WINDOW}, global all {trace.context_length}" in texts
    llama = tiny_model("llama")
    _, traces = decode(llama, "Paged attention stores the cache in blocks of the pool", 3)
    texts = [a.text for a in step_figure(traces[-1], llama.info).layout.annotations]
    assert "x1 = x0 + attention(norm(x0))" in texts and not any("→ norm" in t for t in texts)
