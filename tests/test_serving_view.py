"""The Serving view and its chapter ("Many requests, one cache"), on both embedded models: the class it serves answers
each request as that request alone would; its requests arrive at their steps; the step's sentence, the counter, the
pool and the table say what the server's own steps did (recomputed here from the engine's `Server`); a pool too small
is a message; the chapter's numbers are the step's (tests/test_lesson.py calls `serving_numbers`); in Chromium the
view's controls and → / ← reach the link and the figure."""

import re

import pytest
import torch
from playwright.sync_api import expect

import engine
from engine.server import Server
from tests.app_helpers import assert_clean, start
from tests.helpers import idle, until_link, widget
from ui.lesson.chapters import CHAPTERS
from ui.runs.serving import BLOCK_SIZE, ServedClass, serving_setup
from ui.state.link import AppState
from ui.text import strings
from viz.serving import pool_figure, request_label

# (model, language, chat) as a page opens them: English on SmolLM2 with its template, Chinese on Gemma without
PAGES = [("embedded", "en", True), ("embedded-zh", "zh", False)]
FIXTURES = {"embedded": "embedded_model", "embedded-zh": "embedded_zh_model"}
BLOCK = BLOCK_SIZE
CHAPTER = next(c for c in CHAPTERS if c.key == "serving")


def setup_of(model, lang: str, chat: bool, blocks: int = AppState.serve_blocks, seqs: int = AppState.serve_seqs):
    return serving_setup(model, lang, chat, blocks, seqs)


def reference_steps(model, setup) -> list:
    """The setup served by the engine's Server directly, its arrivals as the view documents them: a request is added
    before the first step after `arrival` steps ran (the next ones at once when nothing runs or waits)."""
    server = Server(model, setup.num_blocks, setup.block_size, setup.max_num_seqs, setup.max_num_batched_tokens)
    added, reports = 0, []
    while added < len(setup.prompts) or not server.finished:
        due = [i for i in range(added, len(setup.prompts)) if setup.arrivals[i] <= len(reports)]
        if not due and server.finished:
            due = [i for i in range(added, len(setup.prompts)) if setup.arrivals[i] == setup.arrivals[added]]
        for i in due:
            server.add(list(setup.prompts[i]), setup.max_tokens[i])
        added += len(due)
        reports.append(server.step())
    return reports


def alone(model, ids, max_tokens: int) -> tuple[list[int], str]:
    generation = engine.Generation(model, list(ids), max_new_tokens=max_tokens, capture=engine.NO_RECORD)
    generation.prefill()
    while not generation.finished:
        generation.step()
    return list(generation.generated), generation.text_after(len(generation.generated))


@pytest.fixture(params=PAGES, ids=lambda p: f"{p[0]}-{p[1]}")
def page_setup(request):
    name, lang, chat = request.param
    model = request.getfixturevalue(FIXTURES[name])
    return name, lang, model, setup_of(model, lang, chat)


def test_the_class_is_the_servers_steps_and_its_requests_arrive_at_their_steps(page_setup):
    _, _, model, setup = page_setup
    served = ServedClass(model, setup)
    served.advance_to(10_000)
    assert served.finished
    assert [s.report for s in served.steps] == reference_steps(model, setup)  # batches, states, tables, owners
    first_step = [next(i for i, s in enumerate(served.steps) if rid in s.arrived) for rid in range(len(setup.prompts))]
    assert first_step == list(setup.arrivals), "a request arrived at another step than its own"
    assert any(s.report.preempted for s in served.steps), "the default pool preempts nobody: chapter 18's question"
    assert any(len(owners) > 1 for s in served.steps for owners in s.report.owners.values()), "no block was shared"


@pytest.fixture(scope="module")
def float32_gemma():
    return engine.load_model("embedded-zh", device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("which", ["embedded", "embedded-zh"])
def test_in_float32_each_request_answers_as_it_would_alone(which, request):
    """What the view's caption says in float32 (SmolLM2 as the app holds it, Gemma 3 converted to float32): every
    request's tokens and text, served in the class, are those of its own run."""
    model = request.getfixturevalue("embedded_model" if which == "embedded" else "float32_gemma")
    lang, chat = ("en", True) if which == "embedded" else ("zh", False)
    setup = setup_of(model, lang, chat)
    served = ServedClass(model, setup)
    served.advance_to(10_000)
    last = served.steps[-1]
    for rid, (ids, limit) in enumerate(zip(setup.prompts, setup.max_tokens)):
        tokens, text = alone(model, ids, limit)
        assert list(last.report.requests[rid].generated) == tokens, rid
        assert last.texts[rid] == text, rid


@pytest.mark.parametrize("name", ["embedded", "embedded-zh"])
def test_the_caption_says_whether_a_batch_keeps_each_requests_tokens(name, embedded_model, embedded_zh_model):
    at = start(view="serving", step=2, model=name)
    assert_clean(at)
    model = embedded_model if name == "embedded" else embedded_zh_model
    key = "serve_exact_float32" if model.info.dtype == "float32" else "serve_exact_bfloat16"
    assert any(plain(strings.t(key, "en", dtype=model.info.dtype)) in plain(c.value) for c in at.caption)


def interesting_steps(reports) -> list[int]:
    """The page steps worth reading: before the first, the first prefills, a decode, the first preemption, the last."""
    preempting = next(i + 1 for i, r in enumerate(reports) if r.preempted)
    decoding = next(i + 1 for i, r in enumerate(reports) if not r.prefill)
    return sorted({0, 1, 2, decoding, preempting, len(reports)})


def names(ids) -> str:
    return ", ".join(request_label(i) for i in ids)


def expected_sentence_parts(report, total: int) -> list[str]:
    """What the step's sentence must say: whom it ran (and a prefill's tokens), whom it preempted, who waits."""
    ran = [rid for rid, _, _ in report.ran]
    parts = [names(ran)]
    if report.prefill:
        parts += [str(sum(t for _, t, _ in report.ran)), str(sum(c for _, _, c in report.ran))]
    if report.preempted:
        parts.append(names(report.preempted))
    waiting = [
        s.id for s in report.requests if s.id not in ran and s.id not in report.preempted and s.status != "finished"
    ]  # not admitted, preempted earlier, or running past max_num_seqs
    if waiting:
        parts.append(names(waiting))
    if all(s.status == "finished" for s in report.requests) and len(report.requests) == total:
        parts.append(str(total))
    return parts


def plain(markdown: str) -> str:
    return markdown.replace("\\", "")


def test_the_views_sentence_counter_pool_and_table_are_the_servers_steps(page_setup):
    name, lang, model, setup = page_setup
    reference = reference_steps(model, setup)
    for step in interesting_steps(reference):
        at = start(view="serving", step=step, model=name, lang=lang)
        assert_clean(at)
        assert not at.warning, [w.value for w in at.warning]
        texts = [plain(m.value) for m in at.markdown]
        counter = strings.t("serve_counter_ready", lang)
        if step:
            report = reference[step - 1]
            sentence = next(
                t
                for t in texts
                if t.startswith(
                    "**"
                    + strings.t("serve_did_prefill" if report.prefill else "serve_did_decode", lang).split("{")[0][2:]
                )
            )
            for part in expected_sentence_parts(report, len(setup.prompts)):
                assert part in sentence, (step, part, sentence)
            title = strings.t("serve_pool_title", lang, step=step, used=len(report.owners), blocks=setup.num_blocks)
            assert any(title in t for t in texts), (step, title)
            counter = strings.t(
                "serve_counter_prefill" if report.prefill else "serve_counter_decode",
                lang,
                step=step,
                n=len(report.ran),
            )
            column = strings.figure_words(lang)["serve_col_request"]
            table = next(d.value for d in at.dataframe if list(d.value.columns)[:1] == [column])
            arrived = {s.id for s in report.requests}
            assert list(table.iloc[:, 0]) == [request_label(i) for i in sorted(arrived)], step
            blocks = [" ".join(map(str, report.requests[i].blocks)) for i in sorted(arrived)]
            assert list(table.iloc[:, 5]) == blocks, step
        else:
            assert strings.t("serve_ready", lang, n=1, total=len(setup.prompts)) in [i.value for i in at.info]
        assert counter in at.session_state["page"].counter_html, step
        assert at.button(key="b_next").disabled == (step == len(reference)), step


def test_past_the_last_step_the_page_shows_the_last_and_next_is_off(embedded_model):
    reference = reference_steps(embedded_model, setup_of(embedded_model, "en", True))
    at = start(view="serving", step=999)
    assert_clean(at)
    assert at.query_params["step"] == str(len(reference)) and at.button(key="b_next").disabled
    at.button(key="b_back").click().run()
    assert at.query_params["step"] == str(len(reference) - 1) and not at.button(key="b_next").disabled


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_pool_too_small_for_one_request_is_a_message_in_the_pages_language(lang, embedded_model, embedded_zh_model):
    model = embedded_model if lang == "en" else embedded_zh_model
    needed = setup_of(model, lang, lang == "en").fewest_blocks()
    at = start(view="serving", step=3, serve_blocks=needed - 1, lang=lang)
    assert_clean(at)
    assert [w.value for w in at.warning] == [strings.t("serve_pool_too_small", lang, needed=needed, blocks=needed - 1)]
    assert at.button(key="b_next").disabled
    at.number_input(key="w_serve_blocks").set_value(needed).run()  # the fix the message names
    assert_clean(at)
    assert not at.warning and at.query_params["serve_blocks"] == str(needed)


def test_the_pool_figure_draws_each_blocks_owner_and_fill(embedded_model):
    setup = setup_of(embedded_model, "en", True)
    reference = reference_steps(embedded_model, setup)
    report = next(r for r in reference if any(len(o) > 1 for o in r.owners.values()))
    fig = pool_figure(report, setup.num_blocks, setup.block_size)
    labels = fig.data[0].text
    for block in range(setup.num_blocks):
        owners = [s for s in report.requests if block in s.blocks]
        if not owners:
            assert labels[block] == str(block)
            continue
        logical = owners[0].blocks.index(block)
        held = min(BLOCK, owners[0].cached - logical * BLOCK)
        who = f"×{len(owners)}" if len(owners) > 1 else request_label(owners[0].id)
        assert labels[block] == f"<b>{who}</b><br>{held}/{BLOCK}", block


def serving_numbers(model, lang: str, chat: bool, step: int) -> list[str]:
    """What chapter 18 must quote at `step` on this page's class, recomputed from the engine's own steps: the
    requests, the pool, whom the step ran (a prefill's tokens), the shared blocks and the bytes not stored again,
    the blocks in use and their holders, and the preemptions so far."""
    setup = setup_of(model, lang, chat)
    reports = reference_steps(model, setup)[:step]
    report = reports[-1]
    numbers = [
        len(setup.prompts),
        setup.num_blocks,
        BLOCK,
        step,
        names(r for r, _, _ in report.ran),
        len(report.owners),
        sum(1 for s in report.requests if s.blocks),
    ]
    if report.prefill:
        numbers += [sum(t for _, t, _ in report.ran), sum(c for _, _, c in report.ran)]
    shared = [owners for owners in report.owners.values() if len(owners) > 1]
    if shared:
        again = sum(len(o) - 1 for o in shared) * BLOCK * model.info.kv_bytes_per_token
        numbers += [len(shared), f"×{max(len(o) for o in shared)}", f"{again / 1024:,.1f}"]
    preempted = [(i + 1, r.preempted) for i, r in enumerate(reports) if r.preempted]
    if preempted:
        numbers += [preempted[0][0], names(preempted[0][1])]
    return [str(x) for x in numbers]


def test_the_chapters_preemption_sentence_follows_the_pool(embedded_model):
    """With a roomy pool nobody is preempted up to the chapter's step, and the chapter says so; with the default,
    SmolLM2's class is preempted by then (tests/test_lesson.py checks that sentence's numbers)."""
    at = start(chapter=CHAPTER.number, serve_blocks=40)
    assert_clean(at)
    answer = plain(at.container("chapter").markdown[-1].value)
    assert strings.t("lesson_serve_no_preemption", "en", step=CHAPTER.step, blocks=40) in answer


@pytest.mark.browser
def test_the_views_controls_and_arrows_reach_the_link_and_the_pool(server, page):
    page.goto(f"{server}/?view=serving&step=3")
    until_link(page, step="3", view="serving")
    title = page.locator(".kv-figure-title").first
    expect(title).to_contain_text("after step 3")
    page.locator(".st-key-b_next button").click()
    until_link(page, step="4")
    expect(title).to_contain_text("after step 4")
    page.keyboard.press("ArrowLeft")  # the last control clicked was Next: the arrows step the server
    until_link(page, step="3")
    expect(title).to_contain_text("after step 3")
    idle(page)
    widget(page, "w_serve_blocks").get_by_test_id("stNumberInputStepUp").click()  # the number input's +
    until_link(page, serve_blocks="11")
    expect(title).to_contain_text("of 11 blocks")
    idle(page)
    slider = widget(page, "w_serve_seqs").get_by_role("slider")
    slider.focus()
    slider.press("ArrowLeft")
    until_link(page, serve_seqs="3")
    expect(page.locator(".st-key-main-figure")).to_be_visible()
    assert re.search(r"server step 3", page.locator(".kv-counter").inner_text())
