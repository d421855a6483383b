"""A round of the class answers through the page (ui/follow/ask_round.py, ui/views/ask.py), headless: the teacher asks,
students send guesses, the teacher's count, close and reveal; only the leading page has the round's controls, and a
student's page cannot open, reveal or reset one; every bad input is a message in the page's language that changes
nothing else; the reveal is the engine's."""

import csv
import io

import pytest

import engine
from engine.sampler import distribution, filter_logits
from engine.tokens import candidate_cells
from tests.app_helpers import assert_clean, start
from tests.test_follow import code_in, follow_link, settle
from ui.follow import ask_student, class_answers
from ui.follow.ask_student import GUESS_KEY, VOTE_KEY
from ui.follow.class_answers import tally_of
from ui.follow.class_votes import LETTERS
from ui.lesson.chapters import CHAPTERS, number_of
from ui.text import strings
from viz.style import fmt_probability
from viz.tokens import position_label

STEP = 2


@pytest.fixture
def asked(embedded_model, monkeypatch):
    """A teacher's page at step STEP with a round open, its follow code, and a hand clock for the students' sends."""
    now = [100.0]
    monkeypatch.setattr(ask_student, "clock", lambda: now[0])
    lead = start(lead=1, step=STEP)
    assert_clean(lead)
    lead.button(key="b_ask_open").click().run()
    assert_clean(lead)
    assert int(lead.query_params["ask"]) > 0
    settle()
    return lead, code_in(follow_link(lead)), now


def send(page, text: str, lang: str = "en") -> tuple[list[str], list[str]]:
    page.text_input(key=GUESS_KEY).set_value(text)
    next(b for b in page.button if b.label == strings.t("ask_send", lang)).click().run()
    assert_clean(page)
    return [s.value for s in page.success], [w.value for w in page.warning]


def answered(lead) -> int:
    """The teacher's count of answers, as its page says it once the rooms' thread has read the round again."""
    settle()
    lead.run()
    shown = {m.value for m in lead.markdown}
    counts = [n for n in range(50) if f"**{strings.t('ask_count_open', 'en', n=n)}**" in shown]
    assert len(counts) == 1, shown
    return counts[0]


def test_students_guess_the_teacher_reveals_and_every_page_shows_the_samplers_round(asked, embedded_model):
    lead, code, now = asked
    students = [start(follow=code) for _ in range(3)]
    for page, guess in zip(students, ["a", "a", "the"]):
        assert not [b for b in page.button if b.key and b.key.startswith("b_ask_")]  # the teacher's alone
        sent, refused = send(page, guess)
        assert sent == [strings.t("ask_sent", "en")] and not refused
        now[0] += 5
    sent, _ = send(students[2], "cache")  # a second answer replaces the browser's first
    assert sent and answered(lead) == 3
    lead.button(key="b_ask_close").click().run()
    settle()
    _, refused = send(students[0], "late")  # a page still drawn open: the room, as the server read it, is closed
    assert refused == [strings.t("ask_refused_closed", "en")]
    lead.button(key="b_ask_reveal").click().run()
    assert_clean(lead)

    generation = engine.Generation(embedded_model, "What is a KV cache?", chat=True, max_new_tokens=16)
    generation.prefill()
    for _ in range(STEP):
        trace = generation.step()
    ids = generation.prompt_ids + generation.generated[:STEP]
    before = embedded_model.tokenizer.decode(generation.prompt_ids) + generation.text_after(STEP)
    tokens = [class_answers.guess_token(embedded_model.tokenizer, ids[-1], before, g) for g in ["a", "a", "cache"]]
    assert tally_of(lead.query_params["ask_tally"]) == class_answers.counts_of(dict(enumerate(map(str, tokens))))
    p = float(distribution(filter_logits(trace.logits, engine.Sampling()))[tokens[0]])
    label = position_label(candidate_cells(embedded_model.tokenizer, ids, [tokens[0]])[0])
    sentence = strings.t(
        "ask_favourite", "en", k=tokens.count(trace.token_id), n=3, token=f"“{label}”", p=fmt_probability(p)
    )
    settle()
    for page in [lead, *students]:
        page.run()
        assert_clean(page)
        assert f"**{sentence}**" in [m.value for m in page.markdown], [m.value for m in page.markdown]
    lead.button(key="b_next").click().run()  # → goes on: the round ends with its step
    assert "ask" not in lead.query_params and lead.query_params["step"] == str(STEP + 1)


# (Too long: the box's own limit cuts a value at MAX_GUESS_CHARS, a forged one too; `checked_guess` refuses one that
# gets past it: tests/test_class_answers.py.)
BAD = [
    ("", "empty", {}),
    ("<b>hi</b>", "markup", {}),
    ("<|im_start|>", "control_token", {"token": "<|im_start|>"}),
    ("ring\x07", "control_chars", {}),
]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_bad_guess_is_a_message_in_the_pages_language_and_counts_nothing(asked, lang):
    lead, code, now = asked
    page = start(follow=code, lang=lang)
    for text, reason, values in BAD:
        now[0] += 5
        sent, refused = send(page, text, lang)
        assert refused == [strings.t("ask_refused_" + reason, lang, **values)] and not sent, reason
    assert answered(lead) == 0
    now[0] += 0.5  # a flood: a send within the gap after the last try is refused, whatever it sends
    sent, refused = send(page, "fine", lang)
    assert refused == [strings.t("ask_refused_too_fast", lang, seconds=ask_student.SEND_GAP_SECONDS)]
    assert answered(lead) == 0
    now[0] += 5
    sent, refused = send(page, "fine", lang)
    assert sent == [strings.t("ask_sent", lang)] and answered(lead) == 1


def test_a_student_page_cannot_open_reveal_or_reset_a_round(asked):
    lead, code, _ = asked
    student = start(follow=code)
    before = dict(lead.query_params)
    for key in ("b_ask_open", "b_ask_close", "b_ask_reveal", "b_ask_again"):
        with pytest.raises(KeyError):
            student.button(key=key)
    student.query_params["ask_phase"] = "shown"  # the student's own link says "shown": the room does not
    student.query_params["ask_tally"] = "1:99"
    student.run()
    settle()
    lead.run()
    assert dict(lead.query_params) == before


def vote(page, choice: int | None, lang: str = "en") -> tuple[list[str], list[str]]:
    page.run()
    if choice is not None:
        page.radio(key=VOTE_KEY).set_value(choice)
    next(b for b in page.button if b.label == strings.t("ask_send", lang)).click().run()
    assert_clean(page)
    return [s.value for s in page.success], [w.value for w in page.warning]


def test_the_class_votes_on_the_chapters_question_then_again_and_every_page_counts_who_changed(
    embedded_model, monkeypatch
):
    """Chapter 7 (GQA) on SmolLM2: its right choice is the lesson file's first, shown where the chapter's order puts
    it; three students vote (right, wrong, right), the teacher reveals, then after discussion a vote again (one
    moves to the right one, one away from it, one stays), and every page says so."""
    now = [100.0]
    monkeypatch.setattr(ask_student, "clock", lambda: now[0])
    chapter = CHAPTERS[number_of("gqa") - 1]
    right = chapter.choice_order(len(chapter.choices("en"))).index(0)
    wrong, other = [c for c in range(3) if c != right]
    lead = start(lead=1, chapter=chapter.number)
    lead.button(key="b_vote_open").click().run()
    assert_clean(lead)
    assert lead.query_params["ask_kind"] == "vote"
    settle()
    students = [start(follow=code_in(follow_link(lead))) for _ in range(3)]
    for page in students:
        assert not [b for b in page.button if b.key and b.key.startswith(("b_ask_", "b_vote_"))]  # the teacher's
    sent, refused = vote(students[0], None)
    assert refused == [strings.t("ask_refused_no_choice", "en")] and not sent
    for page, choice in zip(students, [right, wrong, right]):
        now[0] += 5
        sent, refused = vote(page, choice)
        assert sent == [strings.t("ask_sent", "en")] and not refused
    assert answered(lead) == 3
    lead.button(key="b_ask_reveal").click().run()
    first = strings.t("vote_right", "en", k=2, n=3, choice=LETTERS[right])
    settle()
    for page in [lead, *students]:
        page.run()
        assert f"**{first}**" in [m.value for m in page.markdown]

    lead.button(key="b_vote_again").click().run()
    settle()
    for page, choice in zip(students, [wrong, right, right]):
        now[0] += 5
        assert vote(page, choice)[0] == [strings.t("ask_sent", "en")]
    lead.button(key="b_ask_reveal").click().run()
    assert_clean(lead)
    again = strings.t("vote_moved", "en", k0=2, n0=3, k=2, n=3, changed=2, both=3, choice=LETTERS[right])
    settle()
    for page in [lead, *students]:
        page.run()
        assert f"**{again}**" in [m.value for m in page.markdown]
        moved = page.dataframe[0].value
        assert sorted(zip(*[moved[c] for c in moved.columns])) == sorted(
            [(LETTERS[right], LETTERS[wrong], 1), (LETTERS[wrong], LETTERS[right], 1)]
        )
    assert [
        c.value for c in students[0].caption if c.value == strings.t("vote_yours_revealed", "en", choice=LETTERS[wrong])
    ]
    asked = lead.session_state["follow"].asked  # what the teacher's Export downloads
    rows = list(csv.DictReader(io.StringIO(class_answers.export_csv([r for rs in asked.values() for r in rs]))))
    for kind, votes in (("vote", [right, wrong, right]), ("vote again", [wrong, right, right])):
        assert [(r["answer"][0], r["count"], r["right"]) for r in rows if r["kind"] == kind] == [
            (LETTERS[c], str(votes.count(c)), str(int(c == right))) for c in range(3)
        ], kind
    assert sorted((r["answer"], r["count"]) for r in rows if r["kind"] == "changed") == sorted(
        [(f"{LETTERS[right]} → {LETTERS[wrong]}", "1"), (f"{LETTERS[wrong]} → {LETTERS[right]}", "1")]
    )
    lead.button(key="b_chapter_next").click().run()  # the next chapter: the round ends with its chapter
    assert "ask" not in lead.query_params
