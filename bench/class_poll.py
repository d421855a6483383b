"""The class answers under a class's load: a teacher leads a room, every student answers within the same second, the
teacher reveals.

    HF_HUB_OFFLINE=1 python bench/class_poll.py [--students 30] [--rounds 5]
    HF_HUB_OFFLINE=1 python bench/class_poll.py --servers 3 --students 150 --rounds 2

One server (`streamlit run serve.py` on a free loopback port, tests/server.py's `running_server`, with this shell's
environment), or with `--servers N` scripts/serve_class.py's nginx in front of N servers sharing a redis-server.
The teacher is a real Chromium page (`?lead=1&step=1`, English, SmolLM2); the students are websocket sessions without a
browser (bench/class_on_host.py's `Student`), half of them in Chinese (their own language; the model is the teacher's),
each with a browser id of its own (no cookie: a fresh one per session). Both models are loaded first.

Each round: the teacher clicks "Ask" and waits until every student was sent the box; then every student sends a guess
(one of a few words, so the class has favourites) at a random moment within the same second. Printed, over all rounds:
- acknowledged: from a student's send until the server sent that page its "Sent" message, p50 / p90, and how many
  were not acknowledged within a minute;
- counted: the teacher's count (its strip, read until it stops changing) and the reveal's "n" against the students
  who were acknowledged: every answer counted once, or the difference;
- reveal drawn: from the teacher's click on "Reveal" until its page shows the reveal's figure, p50 / p90;
- the peak RSS of the servers (each one's VmHWM; the sum with several servers).
Then the teacher presses → (the round ends with its step) and the next round is asked. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from streamlit.proto.BackMsg_pb2 import BackMsg  # noqa: E402
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # noqa: E402

from bench.class_on_host import OPEN_S, WAIT_S, Seat, Student, open_teacher, p50_p90, wait_for  # noqa: E402
from tests.helpers import IDLE, press  # noqa: E402
from tests.server import ROOT, chromium, running_server  # noqa: E402
from ui.text import strings  # noqa: E402

GUESSES = ("a", "the", "cache", "KV", "memory", "a", "the")  # a class with favourites
ACK_S = 60  # a send not acknowledged within this is counted as lost


class Answering(Student):
    """A student that also finds its round's box (the text input and the form's Send) and sends a guess through it."""

    def __init__(self, url: str, query: str, seat: Seat):
        self.box: tuple[str, str, str] | None = None  # (the input's id, the Send button's id, their fragment)
        self.box_at = 0.0
        super().__init__(url, query, seat)

    def _read(self, at: float, msg: ForwardMsg) -> None:
        super()._read(at, msg)
        element = msg.delta.new_element if msg.WhichOneof("type") == "delta" else None
        if element is None:
            return
        if element.WhichOneof("type") == "text_input" and element.text_input.id.endswith("v_ask_guess"):
            self.box, self.box_at = (element.text_input.id, "", msg.delta.fragment_id), at
        elif (
            element.WhichOneof("type") == "button"
            and element.button.is_form_submitter
            and self.box
            and element.button.form_id == "ask-form"
        ):
            self.box = (self.box[0], element.button.id, self.box[2])

    def has_box(self, since: float) -> bool:
        self._scan()
        return self.box is not None and self.box[1] != "" and self.box_at >= since

    def send_guess(self, guess: str) -> float:
        """Type `guess` and press Send, as one message (a form sends its widgets with its button); when sent."""
        text_id, button_id, fragment = self.box
        msg = BackMsg()
        msg.rerun_script.query_string, msg.rerun_script.fragment_id = self.link, fragment
        msg.rerun_script.widget_states.widgets.add(id=text_id, string_value=guess)
        msg.rerun_script.widget_states.widgets.add(id=button_id, trigger_value=True)
        with self._send_lock:
            sent = time.perf_counter()
            self._socket.send(msg.SerializeToString())
        return sent


@contextlib.contextmanager
def servers(count: int):
    """The app's URL and its server processes: one server, or serve_class.py's nginx over `count`."""
    log = Path(tempfile.gettempdir()) / "kvscope-class-poll.log"
    if count == 1:
        with running_server(log, root=ROOT) as (url, process):
            yield url, [psutil.Process(process.pid)]
        return
    with open(log, "w") as out:
        script = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "serve_class.py"), "--port", "18090", "--servers", str(count)],
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
        )
        try:
            line = next(line for line in script.stdout if line.startswith("kvscope: http"))
            apps = [
                p for p in psutil.Process(script.pid).children(recursive=True) if "streamlit" in " ".join(p.cmdline())
            ]
            yield line.split()[1], apps
        finally:
            script.terminate()
            script.wait(timeout=60)


def count_shown(page) -> int | None:
    text = page.locator(".st-key-ask-count").inner_text() if page.locator(".st-key-ask-count").count() else ""
    found = re.match(r"(\d+) answered", text)
    return int(found.group(1)) if found else None


def run(args) -> None:
    acknowledged, drawn, lost, miscounted = [], [], 0, []
    with servers(args.servers) as (url, apps), chromium() as browser:
        page, _, follow_query = open_teacher(browser, url, "en")
        print(f"teacher at {url}; {len(apps)} server(s)", flush=True)
        chinese = Student(url, "lang=zh&step=1", Seat("warm-up", "zh", 0))  # the host holds both models
        assert wait_for(chinese.ready, OPEN_S, every=0.2), "the Chinese model did not load"
        chinese.close()
        langs = ["zh" if i % 2 else "en" for i in range(args.students)]
        students = [
            Answering(url, follow_query + ("&lang=zh" if lang == "zh" else ""), Seat("follower", lang, i))
            for i, lang in enumerate(langs)
        ]
        assert wait_for(lambda: all(s.ready() for s in students), OPEN_S, every=0.5), "a student's page never drew"
        print(f"{args.students} students follow", flush=True)
        rng = random.Random(7)
        for round_number in range(args.rounds):
            asked = time.perf_counter()
            press(page, "b_ask_open")
            assert wait_for(lambda: all(s.has_box(asked) for s in students), WAIT_S, every=0.1), (
                f"not every student was sent the box: {sum(s.has_box(asked) for s in students)}"
            )
            start = time.perf_counter() + 0.5
            sends: dict[int, float] = {}

            def answer(i: int, student: Answering) -> None:
                time.sleep(max(0.0, start + rng.random() - time.perf_counter()))
                sends[i] = student.send_guess(GUESSES[i % len(GUESSES)])

            threads = [threading.Thread(target=answer, args=(i, s)) for i, s in enumerate(students)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            sent_text = str(strings.t("ask_sent", "en"))
            sent_zh = str(strings.t("ask_sent", "zh"))
            acks = {
                i: wait_for(lambda s=s, i=i: s.sent_after(sends[i], sent_zh if i % 2 else sent_text), ACK_S)
                for i, s in enumerate(students)
            }
            acknowledged += [1000 * (at - sends[i]) for i, at in acks.items() if at is not None]
            lost += sum(at is None for at in acks.values())
            counted = sum(at is not None for at in acks.values())
            shown = wait_for(lambda: count_shown(page) == counted, 10, every=0.2) and counted
            clicked = time.perf_counter()
            press(page, "b_ask_reveal")
            page.wait_for_selector(".st-key-ask .js-plotly-plot", timeout=WAIT_S * 1000)
            drawn.append(1000 * (time.perf_counter() - clicked))
            said = re.search(r"(\d+) of (\d+) guessed", page.locator(".st-key-ask").inner_text())
            revealed = int(said.group(2)) if said else None
            if shown != counted or revealed != counted:
                miscounted.append((round_number, counted, count_shown(page), revealed))
            strip = shown or count_shown(page)
            print(
                f"round {round_number + 1}: {counted} acknowledged, the strip said {strip}, the reveal n = "
                f"{revealed}; reveal drawn in {drawn[-1]:.0f} ms",
                flush=True,
            )
            page.wait_for_selector(IDLE, timeout=WAIT_S * 1000)
            press(page, "b_next")
            page.wait_for_selector(IDLE, timeout=WAIT_S * 1000)
            time.sleep(2)
        hwm = (
            sum(
                int(
                    next(
                        line.split()[1]
                        for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                        if line.startswith("VmHWM")
                    )
                )
                for p in apps
            )
            // 1024
        )
        for student in students:
            student.close()
    ack, reveal = p50_p90(acknowledged), p50_p90(drawn)
    print(f"\n| the class answers ({args.students} students, {args.rounds} rounds, {args.servers} server(s)) | |")
    print("|---|---|")
    print(f"| acknowledged, p50 / p90 | {ack[0]:.0f} / {ack[1]:.0f} ms |")
    print(f"| not acknowledged within {ACK_S} s | {lost} |")
    print(f"| rounds counted wrong (round, acknowledged, strip, reveal) | {miscounted or 'none'} |")
    print(f"| reveal drawn, p50 / p90 | {reveal[0]:.0f} / {reveal[1]:.0f} ms |")
    print(f"| VmHWM{' (sum of the servers)' if len(apps) > 1 else ''} | {hwm} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--servers", type=int, default=1)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
