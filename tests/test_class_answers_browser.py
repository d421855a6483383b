"""The class answers in headless Chromium: a teacher at 1280×720 and three students at phone width (390×844), each in
a browser context of its own, on one server. English on SmolLM2 and Chinese on Gemma 3: the teacher asks what comes
next, the students guess (one refused, one reloads and answers again), the teacher reveals, and every page says the
round's sentence with the sampler's own probability, computed here by the engine. Then a chapter's question: the
class votes, the teacher reveals, the class votes again, and every page shows both rounds and who changed."""

import re

import pytest
from playwright.sync_api import expect

import engine
from engine.sampler import distribution, filter_logits
from engine.tokens import candidate_cells
from tests.helpers import WAIT_MS, press, until_link
from tests.server import settled_text
from ui.follow.class_answers import guess_token
from ui.follow.class_votes import LETTERS
from ui.lesson.chapters import CHAPTERS, number_of
from ui.text import strings
from viz.style import fmt_probability
from viz.tokens import position_label

pytestmark = pytest.mark.browser
STEP = 1  # the round is asked after the prefill: the class predicts the answer's second token
GUESSES = {"en": ("a", "a", "the", "cache"), "zh": ("一种", "一种", "存储", "数据")}  # A, B, C, then C after a reload


@pytest.fixture
def classroom(browser):
    """The teacher's page at 1280×720 and three students' at 390×844, each in a context of its own."""
    contexts = [browser.new_context(viewport={"width": 1280, "height": 720})] + [
        browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True) for _ in range(3)
    ]
    yield [context.new_page() for context in contexts]
    for context in contexts:
        context.close()


def plain(text: str) -> str:
    """A string as the page shows it: its Markdown escapes gone."""
    return re.sub(r"\\(.)", r"\1", str(text))


def expected_round(model, lang: str, answers: list[str]) -> str:
    """The reveal's sentence for `answers`, from the engine's own step: the default prompt of `lang`, greedy."""
    from ui.state.link import language_defaults

    state = language_defaults(lang)
    generation = engine.Generation(model, state.prompt, chat=state.chat, sampling=engine.Sampling(), max_new_tokens=16)
    generation.prefill()
    trace = generation.step()  # token STEP + 1
    context = generation.prompt_ids + generation.generated[:STEP]
    prompt_text = model.tokenizer.decode(generation.prompt_ids)
    before = generation.text_after(STEP)
    tokens = [guess_token(model.tokenizer, context[-1], prompt_text + before, a) for a in answers]
    probabilities = distribution(filter_logits(trace.logits, engine.Sampling()))
    favourite = max(set(tokens), key=tokens.count)
    label = position_label(candidate_cells(model.tokenizer, context, [favourite])[0])
    generation.close()
    return plain(
        strings.t(
            "ask_favourite",
            lang,
            k=tokens.count(trace.token_id),
            n=len(tokens),
            token=f"“{label}”",
            p=fmt_probability(float(probabilities[favourite])),
        )
    )


def send(page, lang: str, guess: str) -> None:
    box = page.locator(".st-key-ask input")
    expect(box).to_be_visible(timeout=WAIT_MS)
    box.fill(guess)
    page.get_by_role("button", name=strings.t("ask_send", lang)).click()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_class_predicts_and_every_page_reveals_the_samplers_probabilities(server, classroom, lang, request):
    model = request.getfixturevalue("embedded_model" if lang == "en" else "embedded_zh_model")
    teacher, *students = classroom
    a, b, c, c_again = GUESSES[lang]
    teacher.goto(f"{server}/?lead=1&lang={lang}")
    settled_text(teacher)
    press(teacher, "b_next")
    until_link(teacher, step=str(STEP))
    href = teacher.locator(".st-key-follow-link a").get_attribute("href")
    for student in students:
        student.goto(href)
        settled_text(student)
        expect(student.get_by_text(plain(strings.t("follow_following", lang)))).to_be_visible()
    assert not students[0].locator(".st-key-ask input").count()  # no round yet: no box
    press(teacher, "b_ask_open")
    teacher.wait_for_function("() => new URL(location.href).searchParams.get('ask') !== null", timeout=WAIT_MS)

    send(students[0], lang, a)
    expect(students[0].get_by_text(plain(strings.t("ask_sent", lang)))).to_be_visible()
    send(students[1], lang, "<kv>x</kv>")  # markup: refused, nothing sent (Gemma reads <b> as a token of its own)
    expect(students[1].get_by_text(plain(strings.t("ask_refused_markup", lang)))).to_be_visible()
    students[1].wait_for_timeout(1100)  # one send a second (the gap is tested with a clock of its own)
    send(students[1], lang, b)
    expect(students[1].get_by_text(plain(strings.t("ask_sent", lang)))).to_be_visible()
    send(students[2], lang, c)
    expect(students[2].get_by_text(plain(strings.t("ask_sent", lang)))).to_be_visible()
    students[2].reload()  # the same browser: its answer is replaced, not added
    settled_text(students[2])
    send(students[2], lang, c_again)
    expect(students[2].get_by_text(plain(strings.t("ask_sent", lang)))).to_be_visible()
    expect(teacher.get_by_text(plain(strings.t("ask_count_open", lang, n=3)))).to_be_visible()

    press(teacher, "b_ask_reveal")
    sentence = expected_round(model, lang, [a, b, c_again])
    for page in [teacher, *students]:
        expect(page.locator(".st-key-ask")).to_contain_text(sentence, timeout=WAIT_MS)
        expect(page.locator(".st-key-ask .js-plotly-plot")).to_be_visible()
    assert teacher.locator(".st-key-ask .js-plotly-plot").bounding_box()["y"] < 720  # on the first screen

    press(teacher, "b_next")  # → goes on as usual: the round ends with its step
    until_link(teacher, step=str(STEP + 1))
    for name, page in zip(("the teacher", "student A", "student B", "student C"), [teacher, *students]):
        expect(page.locator(".kv-counter"), name).to_contain_text(
            re.compile(rf"step {STEP + 1} |第 {STEP + 1} 步"), timeout=WAIT_MS
        )
        settled_text(page)
        assert page.locator(".st-key-ask .js-plotly-plot").count() == 0, f"{name} still shows the reveal"


VOTED = {"en": "decode", "zh": "kv_cache"}  # the chapter each language's class votes on


def vote(page, lang: str, choice: int) -> None:
    ballot = page.locator(".st-key-ask")
    option = ballot.locator("label").filter(has_text=f"{LETTERS[choice]} · ")
    expect(option).to_be_visible(timeout=WAIT_MS)
    option.click()
    ballot.get_by_role("button", name=strings.t("ask_send", lang)).click()
    expect(page.get_by_text(plain(strings.t("ask_sent", lang)))).to_be_visible(timeout=WAIT_MS)


def revealed(page, sentence: str):
    """The round's place once it shows `sentence` (a place the run before drew stays on screen until the run ends)."""
    shown = page.locator(".st-key-ask").filter(has_text=sentence)
    expect(shown).to_have_count(1, timeout=WAIT_MS)
    return shown


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_class_votes_then_votes_again_and_every_page_shows_both_rounds_and_who_changed(server, classroom, lang):
    """Peer instruction on the chapter's question: the class votes (a reload replaces one vote), the teacher reveals,
    the class discusses and votes again; every page shows the counts of both rounds and who changed, and the right
    choice is the one the lesson file lists first, where the chapter's order shows it."""
    teacher, *students = classroom
    chapter = CHAPTERS[number_of(VOTED[lang]) - 1]
    right = chapter.choice_order(len(chapter.choices(lang))).index(0)
    wrong, other = [c for c in range(3) if c != right]
    teacher.goto(f"{server}/?lead=1&lang={lang}&large=1&chapter={chapter.number}")
    settled_text(teacher)
    href = teacher.locator(".st-key-follow-link a").get_attribute("href")
    for student in students:
        student.goto(href)
        settled_text(student)
    press(teacher, "b_vote_open")
    until_link(teacher, ask_kind="vote")
    for student, choice in zip(students, [right, wrong, right]):
        vote(student, lang, choice)
    students[2].reload()  # the same browser: its vote is replaced, not added
    settled_text(students[2])
    students[2].wait_for_timeout(1100)
    vote(students[2], lang, other)
    expect(teacher.get_by_text(plain(strings.t("ask_count_open", lang, n=3)))).to_be_visible(timeout=WAIT_MS)
    press(teacher, "b_ask_reveal")
    first = plain(strings.t("vote_right", lang, k=1, n=3, choice=LETTERS[right]))
    for page in [teacher, *students]:
        expect(revealed(page, first).locator(".js-plotly-plot")).to_be_visible()
    for page, height in ((teacher, 720), (students[0], 844)):  # on the first screen of the projector and a phone
        assert revealed(page, first).locator(".js-plotly-plot").bounding_box()["y"] < height

    press(teacher, "b_vote_again")
    teacher.wait_for_function("() => new URL(location.href).searchParams.get('ask_first') !== null", timeout=WAIT_MS)
    for student, choice in zip(students, [wrong, right, other]):  # two change their vote, one keeps it
        student.wait_for_timeout(1100)
        vote(student, lang, choice)
    expect(teacher.get_by_text(plain(strings.t("ask_count_open", lang, n=3)))).to_be_visible(timeout=WAIT_MS)
    press(teacher, "b_ask_reveal")
    again = plain(strings.t("vote_moved", lang, k0=1, n0=3, k=1, n=3, changed=2, both=3, choice=LETTERS[right]))
    for page in [teacher, *students]:
        expect(revealed(page, again).locator("[data-testid=stDataFrame]")).to_be_visible()  # who changed
    figure = revealed(teacher, again).locator(".js-plotly-plot")
    assert figure.bounding_box()["y"] < 720
    assert sorted(teacher.evaluate("el => el.data.map(t => t.x.join(','))", figure.element_handle())) == sorted(
        [
            ",".join(str([right, wrong, other].count(c)) for c in range(3)),
            ",".join(str([wrong, right, other].count(c)) for c in range(3)),
        ]
    )
    press(teacher, "b_chapter_next")  # the next chapter: the round ends with its chapter
    until_link(teacher, chapter=str(chapter.number + 1))
    for page in students:
        expect(page.locator(".st-key-ask .js-plotly-plot")).to_have_count(0, timeout=WAIT_MS)
