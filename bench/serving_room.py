"""A room of students sending their own questions at once, then watching them served together (issue 47's bench).

    HF_HUB_OFFLINE=1 python bench/serving_room.py [--students 30] [--presses 10] [--pace 2] [--lang en]
        [--blocks 40] [--seqs 8]

One app server (`streamlit run serve.py`, tests/server.py's `running_server`, with this shell's environment: the
host's defaults unless KVSCOPE_* is set), watched as bench/class_on_host.py watches it:
- both models are loaded first (the teacher's page in `--lang`, one page in the other language), so memory is the
  host's with both;
- the teacher: a real Chromium page leading a follow room on the Serving view (`?lead=1&view=serving`);
- `--students` followers without a browser (bench/class_on_host.py's `Student`: websocket sessions that also send
  what a browser sends unasked, their room's polls), which join one after another; then all send a question at the
  same moment, as a press of the page's Send would (the question, the consent box ticked and the button's trigger
  in one rerun of the step's fragment);
- the teacher's page is reloaded (its list is read when it draws), the pool set to `--blocks` and the batch to
  `--seqs` through the link, and "Serve these N questions" clicked in Chromium: a round of the class's questions;
- the teacher presses → `--presses` times, one every `--pace` seconds (later when a press is not yet drawn or a
  follower not yet sent it).
Printed: the questions the list took (and any a page was refused), the seconds from the sends to the last
student's answer; the teacher's → to the header showing the next server step / the run finished, p50 and p90; each
follower's lag (from the key press to that follower being sent the new step's header); the server's peak RSS (and
VmHWM) with both models, and its idle RSS before the class. Run by hand, not in CI; figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamlit.proto.BackMsg_pb2 import BackMsg  # noqa: E402
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # noqa: E402

from bench.class_on_host import (  # noqa: E402
    OPEN_S,
    WAIT_S,
    Seat,
    ServerMemory,
    Student,
    memory_text,
    ms,
    page_clock,
    peak_text,
    wait_for,
)
from tests.server import chromium, running_server  # noqa: E402
from ui.text import strings  # noqa: E402

HEADER = '() => document.querySelector(".kv-counter")?.textContent ?? ""'
IDLE = '() => document.querySelector(\'[data-testid="stApp"]\')?.dataset.testScriptState === "notRunning"'
# One → on the teacher's page: when the header first shows another step, and when the run that drew it has ended
WATCH = (
    """(before) => {
  const header = """
    + HEADER
    + """, idle = """
    + IDLE
    + """;
  const times = {start: null, token: null, drawn: null};
  window.kvPress = times;
  addEventListener("keydown", () => { times.start ??= performance.now(); }, {capture: true, once: true});
  const frame = () => {
    const now = performance.now();
    if (times.start !== null && times.token === null && header() !== "" && header() !== before) times.token = now;
    if (times.token !== null && idle()) { times.drawn = now; return; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}"""
)
QUESTIONS = (
    "Why is the sky blue?",
    "What is a token?",
    "How does a GPU help?",
    "What is attention?",
    "Why do we page memory?",
    "What is a prompt?",
    "How big is this model?",
    "What is a cache hit?",
)
SENT = {lang: strings.t("class_prompt_sent", lang).split("{")[0] for lang in ("en", "zh")}  # a send's answer


class Asker(Student):
    """A follower that also knows its Send box's widgets, and sends one question as a browser's press would."""

    def __init__(self, url: str, query: str, seat: Seat):
        self.box: dict[str, tuple[str, str]] = {}  # key → (widget id, fragment id)
        self.send_enabled = False
        self.sent_reply: float | None = None
        super().__init__(url, query, seat)

    def _read(self, at: float, msg: ForwardMsg) -> None:
        super()._read(at, msg)
        if msg.WhichOneof("type") != "delta":
            return
        element = msg.delta.new_element
        shown = element.WhichOneof("type")
        if shown in ("text_input", "checkbox", "button"):
            widget = getattr(element, shown)
            for key in ("v_class_prompt", "v_class_consent", "b_class_send"):
                if widget.id.endswith("-" + key):
                    self.box[key] = (widget.id, msg.delta.fragment_id)
                    if key == "b_class_send":
                        self.send_enabled = not widget.disabled
        elif shown == "alert" and SENT[self.seat.lang] in element.alert.body and self.sent_reply is None:
            self.sent_reply = at

    def ask(self, question: str) -> float:
        """As a student does: the question typed and the consent ticked (one rerun of the fragment that holds them),
        then, once Send is drawn enabled (a widget of another id), its press; when the press was sent."""
        (text_id, fragment), (consent_id, _) = self.box["v_class_prompt"], self.box["v_class_consent"]
        self._send(
            fragment,
            lambda widgets: (
                widgets.add(id=text_id, string_value=question),
                widgets.add(id=consent_id, bool_value=True),
            ),
        )
        assert wait_for(lambda: self._scan() or self.send_enabled, WAIT_S), "Send never enabled"
        send_id, fragment = self.box["b_class_send"]
        return self._send(fragment, lambda widgets: widgets.add(id=send_id, trigger_value=True))

    def _send(self, fragment: str, fill) -> float:
        msg = BackMsg()
        msg.rerun_script.query_string, msg.rerun_script.fragment_id = self.link, fragment
        fill(msg.rerun_script.widget_states.widgets)
        with self._send_lock:
            sent = time.perf_counter()
            self._socket.send(msg.SerializeToString())
        return sent


def press(page) -> dict[str, float]:
    """One → on the teacher's settled page: ms to the next step's header and to the end of its run."""
    page.evaluate(WATCH, page.evaluate(HEADER))
    page.wait_for_timeout(50)
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => window.kvPress.drawn !== null", timeout=WAIT_S * 1000, polling=50)
    times = page.evaluate("window.kvPress")
    return {"token": times["token"] - times["start"], "drawn": times["drawn"] - times["start"]}


def step_shown(page) -> int:
    return int("".join(ch for ch in page.evaluate(HEADER).split("·")[0] if ch.isdigit()) or 0)


def run(args) -> None:
    log = Path(tempfile.gettempdir()) / "kvscope-serving-room.log"
    other = "zh" if args.lang == "en" else "en"
    with running_server(log) as (url, process), ServerMemory(process.pid) as memory, chromium() as browser:
        memory.phase = "models load"
        teacher = browser.new_page(viewport={"width": 1280, "height": 720})
        teacher.goto(f"{url}/?lead=1&view=serving&step=0&lang={args.lang}", timeout=WAIT_S * 1000)
        teacher.wait_for_selector(".st-key-follow-link a", state="attached", timeout=OPEN_S * 1000)
        follow = urlsplit(teacher.locator(".st-key-follow-link a").get_attribute("href")).query
        warm = Student(url, f"lang={other}&step=1", Seat("warm-up", other, 0))  # the other model, loaded
        assert wait_for(warm.ready, OPEN_S, every=0.2), "the other model did not load"
        warm.close()
        memory.phase = "idle"
        print(f"both models loaded ({log})", flush=True)
        time.sleep(3)
        idle = memory.read()
        memory.phase = "students join"
        students = []
        for number in range(args.students):
            students.append(Asker(url, follow, Seat("follower", args.lang, number)))
            assert wait_for(lambda: students[-1].ready() and len(students[-1].box) == 3, WAIT_S), "a student's box"
        print(f"{len(students)} students joined", flush=True)
        memory.phase = "questions sent"
        start = time.perf_counter()
        threads = [
            threading.Thread(target=s.ask, args=(f"{QUESTIONS[i % len(QUESTIONS)]} (student {i + 1})",))
            for i, s in enumerate(students)
        ]
        for thread in threads:
            thread.start()
        answered = wait_for(lambda: all(s.sent_reply for s in students), WAIT_S, every=0.05)
        took = max((s.sent_reply or time.perf_counter()) for s in students) - start
        refused = sum(1 for s in students if s.sent_reply is None)
        query = urlencode(
            {
                "lead": 1,
                "view": "serving",
                "step": 0,  # the same browser: its cookie resumes the room
                "lang": args.lang,
                "serve_blocks": args.blocks,
                "serve_seqs": args.seqs,
            }
        )
        teacher.goto(f"{url}/?{query}")
        teacher.wait_for_selector(".st-key-b_class_serve button", timeout=WAIT_S * 1000)
        listed = teacher.locator(".st-key-class-questions [data-testid=stText]").count()
        print(f"{listed} questions listed", flush=True)
        memory.phase = "class"
        teacher.locator(".st-key-b_class_serve button").click()
        teacher.wait_for_function(
            "() => new URL(location.href).searchParams.get('serve_round') !== null", timeout=WAIT_S * 1000
        )
        teacher.wait_for_function(IDLE, timeout=WAIT_S * 1000)
        teacher.locator("h1").first.click()
        clock, presses, lags = page_clock(teacher), [], []
        at = time.perf_counter()
        for _ in range(args.presses):
            time.sleep(max(0.0, at - time.perf_counter()))
            presses.append(press(teacher))
            pressed, step = clock + teacher.evaluate("window.kvPress.start") / 1000, step_shown(teacher)
            wait_for(lambda: all(s.step_sent(pressed, step) for s in students), 60, every=0.05)
            lags += [1000 * (sent - pressed) for s in students if (sent := s.step_sent(pressed, step)) is not None]
            at = max(at + args.pace, time.perf_counter())
        time.sleep(1)
        peak, hwm = memory.peak(), memory.read()["VmHWM"]
        for student in students:
            student.close()
    print(
        f"questions: {args.students} sent at once, {listed} listed, {refused} without an answer"
        f"{'' if answered else ' (timed out)'}; last answer {took:.2f} s after the sends"
    )
    print(
        f"teacher → next server step (header / run finished): {ms([p['token'] for p in presses])} / "
        f"{ms([p['drawn'] for p in presses])}  ({len(presses)} presses, pool {args.blocks} blocks, "
        f"at most {args.seqs} a step)"
    )
    print(f"followers' lag: {ms(lags)} over {len(lags)} (of {args.presses * args.students})")
    print(f"idle (both models): {memory_text(idle)}; peak {peak_text(peak)}; VmHWM {hwm / 1024:.0f} MiB")
    print(f"p50 token {statistics.median(p['token'] for p in presses):.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--presses", type=int, default=10)
    parser.add_argument("--pace", type=float, default=2.0)
    parser.add_argument("--lang", choices=("en", "zh"), default="en")
    parser.add_argument("--blocks", type=int, default=40, help="the pool the teacher serves the round from")
    parser.add_argument("--seqs", type=int, default=8, help="the most requests a step")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
