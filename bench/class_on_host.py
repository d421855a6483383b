"""A class on one free host: one app server, a teacher leading a follow room, thirty students, measured together.

    HF_HUB_OFFLINE=1 python bench/class_on_host.py [--students 30] [--presses 10] [--pace 3] [--langs en,zh]
        [--before <git-ref>]

A free host (Streamlit Community Cloud) is about 2 cores and 2.7 GB; this runs the class against ONE server
(`streamlit run serve.py` on a free loopback port, tests/server.py's `running_server`, with this shell's
environment: the host's defaults unless KVSCOPE_* is set) and watches that process.

The class (`--students 30`; fewer keep the same shares):
- the teacher: a real Chromium page that leads a follow room (`?lead=1&step=1`, English, the flow view) and
  presses → `--presses` times, one press every `--pace` seconds (later when a press is not yet drawn or its
  followers not yet sent it);
- 20 followers (two thirds), half with `lang=zh` on the students' link (their own language; the model and
  everything else are the teacher's): websocket sessions without a browser (`Student`, bench/browser_latency.py's
  `SocketFollower`, which opens a link as a browser's first message does and records what the server sends),
  that also send what their browser would send unasked: the reruns Streamlit's `run_every` timers ask for (a
  follower's poll of its room);
- 10 explorers on their own, half English (`embedded`), half Chinese (`lang=zh`: `embedded-zh`), each pressing →
  `--presses` times at the same pace from a random offset: the same kind of session, whose press is the Next
  button's trigger in a rerun of the step's fragment, as the → key's press in a browser sends (so the server does
  an explorer's whole work: the step, its view's figures, the messages; only no browser draws them). 8 of them (4 +
  4) open the heaviest link the host allows, after bench/step_memory.py's worst case: a prompt 2 tokens
  shorter than the longest the host allows on that model (ui/host/limits.py `model_limits`: 382 on SmolLM2 and 686 on
  Gemma 3 270M by default, their own on each page), block size 1 and 64 KV splits,
  which the app fits into its step budget (ui/host/limits.py `StepLimits`: the values it kept are printed), at a late
  step (KVSCOPE_MAX_NEW_TOKENS − presses − 1, so every press still computes one), on the attention or the KV view;
  the other 2 open an ordinary link (the default prompt, step 1, sampled with their own seed, the split, prefix,
  costs or flow view).
Before the class: the teacher's page loads `embedded`, one Chinese page loads `embedded-zh`; then the followers join
one after another and the explorers open their links all at once.

The server's /proc/<pid>/status is read every 100 ms (VmRSS, RssAnon, RssFile). Printed:
- idle: the server after both models loaded, before any student: RSS, and what holds it (anonymous: the
  interpreter's and torch's heaps, weights copied or cast while loading, K/V, traces, figures; file-backed: mapped
  libraries and mapped weight files);
- peak: the highest sampled RSS, when (seconds since the server started, and the phase: followers joining,
  explorers opening, class) and its anon/file split; VmHWM (the kernel's high-water mark, between samples too);
- server's CPU during the presses: its CPU seconds ÷ the presses' wall time (cores kept busy), and in brackets
  everything else's on this machine (the bench's sockets, Chromium, other work: a host runs only the server);
- teacher → token / drawn: from the key's arrival in the teacher's page to the header showing the new step /
  the run finished and painted (bench/browser_latency.py's `press_step`), p50 and p90 over the presses;
- followers' lag: from the teacher's key press to each follower being sent the new step's header (the server's
  share: no follower draws), p50 and p90 over every follower and press, and the last follower's (median over
  presses, and the worst); a follower never sent it within a minute is counted as missed;
- explorers → step sent / run finished: from sending an explorer's press to the server sending the new step's
  header / the end of that run, p50 and p90 (all explorers; the heavy ones on their own line).
`--langs zh`: a Chinese class on `embedded-zh` alone (the teacher's page too; one model loaded), with the same
roles; `--langs en,zh` (the default) as above.
`--explore`: a class exploring on its own, no teacher: every student opens their own link at the same moment and
presses → `--presses` times, each press as soon as the last one's run ended. 8 open the heaviest links (as above,
4 per model), 5 the eviction view at step 32 or 64 of the default prompt, each with another policy (half on each model),
the rest ordinary links. Printed: the ordinary, heavy and eviction presses (→ step sent, p50 / p90), each role's
page opening times, the peak RSS, and the server's CPU seconds per press; where presses went (the server's record,
KVSCOPE_PRESS_LOG: bench/press_parts.py), and the turns each role's pages held.
`--before <ref>`: the same class first against a `git worktree` of `ref`, then against this checkout, in one run;
both side by side. The output ends with a markdown table. Memory and speed are measured here, never asserted in
tests. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, quote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from streamlit.proto.Alert_pb2 import Alert  # noqa: E402
from streamlit.proto.BackMsg_pb2 import BackMsg  # noqa: E402
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # noqa: E402

import engine  # noqa: E402
from bench import press_parts  # noqa: E402
from bench.browser_latency import SocketFollower, Wire, counter, press_step  # noqa: E402
from bench.class_open import CpuSplit  # noqa: E402
from bench.press_parts import Press  # noqa: E402
from tests.server import ROOT, chromium, running_server, settled_text  # noqa: E402
from ui.host.limits import APP_MAX_KV_SPLITS, load_limits  # noqa: E402
from ui.state.link import LANGUAGE_DEFAULTS, default_prompt, parse_query  # noqa: E402

LIMIT_BYTES = int(2.7 * 2**30)  # Streamlit Community Cloud's memory for one app: the host this bench sizes a class for

COUNTER = re.compile(rb'kv-counter">\D*?(\d+)')  # the header's step: "step 8 · …" or "第 8 步 · …"
LIGHT_VIEWS = ("split", "prefix", "costs", "flow")
EVICTION_POLICIES = ("snapkv", "tova", "knorm", "streaming_llm", "observed_attention")
EVICTION_STEPS = (32, 64)  # the eviction pages open at these steps in turn (issue 55's class)
HEAVY_VIEWS = ("attention", "kv")
FINISHED = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY)
OPEN_S = 900  # the explorers' first runs, all at once on 2 cores
WAIT_S = 120  # any one press
FOLLOW_S = 60  # a follower not sent the teacher's step within this is missed
MIB = 1024  # kB


# -- the students ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seat:
    role: str  # "follower", "light" (an explorer on an ordinary link), "heavy" (on the heaviest link) or "evict"
    lang: str  # "en" or "zh"
    number: int  # in its role


def roster(students: int, langs: tuple[str, ...] = ("en", "zh")) -> list[Seat]:
    """Two thirds follow, the rest explore, four fifths of them on the heaviest link; each role shared equally
    among `langs`."""
    followers = round(students * 2 / 3)
    heavy = round((students - followers) * 0.8)
    counts = {"follower": followers, "heavy": heavy, "light": students - followers - heavy}
    return [Seat(role, langs[i % len(langs)], i) for role, count in counts.items() for i in range(count)]


def explorers_roster(students: int, langs: tuple[str, ...] = ("en", "zh")) -> list[Seat]:
    """A class on its own: 8 on the heaviest links, 5 on the eviction view, the rest on ordinary links (fewer
    students keep those shares); each role shared equally among `langs`."""
    heavy, evict = round(students * 8 / 30), round(students * 5 / 30)
    counts = {"heavy": heavy, "evict": evict, "light": students - heavy - evict}
    return [Seat(role, langs[i % len(langs)], i) for role, count in counts.items() for i in range(count)]


@functools.cache
def tokenizer_of(lang: str):
    """The tokenizer of `lang`'s embedded model, from its converted folder (the same in every dtype)."""
    from transformers import AutoTokenizer

    from engine.loader import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source(LANGUAGE_DEFAULTS[lang]["model"]))


def exact_prompt(lang: str, tokens: int, number: int) -> str:
    """A prompt of at most `tokens` tokens (and within a few of it) as the app counts them on `lang`'s model
    without a chat template (engine.prompt.tokenize_prompt): the language's default prompt over and over, after
    the student's number (each heavy explorer its own prompt, so its own run)."""
    from engine.prompt import tokenize_prompt

    tokenizer = tokenizer_of(lang)
    count = lambda text: len(tokenize_prompt(SimpleNamespace(tokenizer=tokenizer), text, chat=False))  # noqa: E731
    ids = tokenizer.encode(f"{number}: " + " ".join([default_prompt(lang)] * tokens), add_special_tokens=False)
    cut, text = tokens, ""
    while (over := count(text := tokenizer.decode(ids[:cut])) - tokens) > 0:
        cut -= over
    return text


def heaviest_prompt(limits, lang: str) -> int:
    """The longest prompt the host allows on `lang`'s model (ui/host/limits.py `model_limits`: a model whose K/V take
    fewer bytes a token gets longer prompts), less 2 as bench/step_memory.py's worst case (382 of 384 on SmolLM2)."""
    from engine.loader import AUTO
    from ui.host.limits import model_limits

    info = engine.load_model(LANGUAGE_DEFAULTS[lang]["model"], dtype=AUTO).info  # its limits need its shapes
    return model_limits(limits, info).max_prompt_tokens - 2


def link_for(seat: Seat, follow_query: str, prompt: str, late_step: int) -> str:
    lang = "&lang=zh" if seat.lang == "zh" else ""
    if seat.role == "follower":
        return follow_query + lang
    if seat.role == "light":
        return f"step=1&view={LIGHT_VIEWS[seat.number % 4]}&temperature=1&seed={100 + seat.number}{lang}"
    if seat.role == "evict":
        policy = EVICTION_POLICIES[seat.number % len(EVICTION_POLICIES)]
        return f"step={EVICTION_STEPS[seat.number % 2]}&view=eviction&evict={policy}&ratio=0.5{lang}"
    return (
        f"prompt={quote(prompt)}&chat=0&block_size=1&kv_splits={APP_MAX_KV_SPLITS}&step={late_step}"
        f"&view={HEAVY_VIEWS[seat.number // 2 % 2]}{lang}"
    )


@dataclass(frozen=True)
class NextButton:
    id: str  # the widget id Streamlit gave the Next button
    fragment: str  # the step fragment's id: a press reruns that fragment alone
    disabled: bool


class Student(SocketFollower):
    """A student without a browser: a `SocketFollower` on the student's link that also sends what its browser
    would: the reruns of Streamlit's `run_every` timers (a follower's poll of its room) and, on `press_next`, the
    Next button's press. It keeps figures' messages only as far as their header's step (figures are megabytes)."""

    SMALL = 8192  # messages under this are parsed: buttons, the link, the end of a run, timers

    def __init__(self, url: str, query: str, seat: Seat):
        self.seat, self.link = seat, query
        self.next_button: NextButton | None = None
        self.error = ""  # the last error the page showed
        self.buttons_at = 0.0  # when the last live Next button arrived
        self.finished_at: list[float] = []  # when each run ended
        self.session_id = ""  # the server's id of this browser session (its record of where presses went)
        self.sizes: list[tuple[float, int]] = []  # when each message arrived, and its bytes
        self._timers: dict[str, tuple[float, float]] = {}  # fragment id → (interval, next rerun)
        self._scanned = 0
        self._scan_lock, self._send_lock, self._closed = threading.Lock(), threading.Lock(), threading.Event()
        super().__init__(url, query)
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self._closed.wait(0.1):
            self._scan()
            now = time.perf_counter()
            for fragment, (interval, due) in list(self._timers.items()):
                if now >= due:
                    self._timers[fragment] = (interval, now + interval)
                    self._rerun(fragment, auto=True)

    def _scan(self) -> None:
        """Read the messages that arrived since the last scan; a figure's keeps only its header's step."""
        with self._scan_lock, self._lock:
            for index in range(self._scanned, len(self.frames)):
                at, data = self.frames[index]
                self.sizes.append((at, len(data)))
                if len(data) > self.SMALL and self.session_id:
                    found = COUNTER.search(data)
                    self.frames[index] = (at, found.group(0) if found else b"")
                    continue
                self._read(at, ForwardMsg.FromString(data))
            self._scanned = len(self.frames)

    def _read(self, at: float, msg: ForwardMsg) -> None:
        kind, element = msg.WhichOneof("type"), msg.delta.new_element
        shown = element.WhichOneof("type") if kind == "delta" else None
        if shown == "button" and element.button.id.endswith("-b_next"):
            self.next_button, self.buttons_at = (
                NextButton(element.button.id, msg.delta.fragment_id, element.button.disabled),
                at,
            )
        elif shown == "exception" or (shown == "alert" and element.alert.format == Alert.ERROR):
            self.error = element.exception.message if shown == "exception" else element.alert.body
        elif kind == "new_session":
            self.session_id = msg.new_session.initialize.session_id
        elif kind == "page_info_changed":
            self.link = msg.page_info_changed.query_string
        elif kind == "script_finished" and msg.script_finished in FINISHED:
            self.finished_at.append(at)
        elif kind == "auto_rerun":
            interval = msg.auto_rerun.interval
            if self._timers.get(msg.auto_rerun.fragment_id, (None,))[0] != interval:
                self._timers[msg.auto_rerun.fragment_id] = (interval, at + interval)
        elif kind == "stop_auto_rerun":
            for fragment in msg.stop_auto_rerun.fragment_ids:
                self._timers.pop(fragment, None)

    def _rerun(self, fragment: str, auto: bool = False, trigger: str = "") -> float:
        """Ask for a rerun of `fragment` (with `trigger`'s press), as the browser does; when it was sent."""
        msg = BackMsg()
        msg.rerun_script.query_string, msg.rerun_script.fragment_id = self.link, fragment
        msg.rerun_script.is_auto_rerun = auto
        if trigger:  # widgets not named keep their values (Streamlit's session state)
            msg.rerun_script.widget_states.widgets.add(id=trigger, trigger_value=True)
        with self._send_lock:
            sent = time.perf_counter()
            self._socket.send(msg.SerializeToString())
        return sent

    def ready(self) -> bool:
        """Its last run ended after drawing live step buttons; a page showing an error raises."""
        self._scan()
        if self.error:
            raise RuntimeError(f"a student's page ({self.seat.role}, {self.seat.lang}) shows: {self.error[:500]}")
        return self.next_button is not None and bool(self.finished_at) and self.finished_at[-1] >= self.buttons_at

    def press_next(self) -> float | None:
        """Press Next (None: it is greyed, the answer has ended); when the press was sent."""
        self._scan()
        button = self.next_button
        if button is None or button.disabled:
            return None
        return self._rerun(button.fragment, trigger=button.id)

    def step_sent(self, since: float, step: int) -> float | None:
        """When the first message from `since` on carried the header of step `step`."""
        with self._lock:
            frames = self.frames[bisect.bisect_left(self.frames, since, key=lambda frame: frame[0]) :]
        for at, data in frames:
            found = COUNTER.search(data)
            if found and int(found.group(1)) == step:
                return at
        return None

    def bytes_between(self, start: float, end: float) -> int:
        """The bytes of the messages that arrived from `start` to `end`."""
        self._scan()
        return sum(size for at, size in self.sizes if start <= at <= end)

    def shown_step(self) -> int | None:
        """The step of the last header it was sent."""
        with self._lock:
            frames = list(self.frames)
        return next((int(found.group(1)) for _, data in reversed(frames) if (found := COUNTER.search(data))), None)

    def finished_after(self, since: float) -> float | None:
        self._scan()
        return next((at for at in self.finished_at if at >= since), None)

    def close(self) -> None:
        self._closed.set()
        super().close()


def wait_for(condition, seconds: float, every: float = 0.02):
    """`condition()` once it is truthy, polled every `every` s; None after `seconds`."""
    deadline = time.perf_counter() + seconds
    while not (value := condition()) and time.perf_counter() < deadline:
        time.sleep(every)
    return value or None


# -- the server's memory --------------------------------------------------------------------------------------


class ServerMemory:
    """Reads the server's /proc/<pid>/status every 100 ms: VmRSS, RssAnon and RssFile (kB), and the class's phase
    then (`phase`)."""

    FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")

    def __init__(self, pid: int):
        self.path = Path(f"/proc/{pid}/status")
        self.start = time.perf_counter()
        self.samples: list[tuple[float, str, dict[str, int]]] = []
        self.phase = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> dict[str, int]:
        lines = (line.split() for line in self.path.read_text().splitlines())
        return {words[0].rstrip(":"): int(words[1]) for words in lines if words and words[0].rstrip(":") in self.FIELDS}

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError):
                self.samples.append((time.perf_counter() - self.start, self.phase, self.read()))

    def last(self, phase: str) -> dict[str, int]:
        """The last sample of `phase`: the server as that phase left it."""
        return [s for s in self.samples if s[1] == phase][-1][2]

    def peak(self, phase: str | None = None) -> tuple[float, str, dict[str, int]]:
        return max((s for s in self.samples if phase in (None, s[1])), key=lambda s: s[2]["VmRSS"])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# -- the class ------------------------------------------------------------------------------------------------


@dataclass
class ClassRun:
    label: str
    heavy_link: str = ""
    joined_s: dict[str, float] = field(default_factory=dict)
    idle: dict[str, int] = field(default_factory=dict)
    joined_rss: dict[str, int] = field(default_factory=dict)  # the server once every follower had joined
    peak: tuple = ()
    class_peak: tuple = ()
    hwm: int = 0
    teacher: list[dict] = field(default_factory=list)  # press_step's times per press
    lags: list[list[float | None]] = field(default_factory=list)  # per press, per follower
    explored: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {"light": [], "heavy": [], "evict": []}
    )
    opened: dict[str, list[float]] = field(default_factory=dict)  # a class exploring: each page's opening, by role
    greyed: int = 0  # explorers' presses not made: Next greyed (the answer ended)
    lost: int = 0  # explorers' presses whose step never came
    errors: list[str] = field(default_factory=list)  # why
    presses: list[Press] = field(default_factory=list)  # each explorer's press, for where it went
    press_log: Path | None = None  # the server's record of where presses went (`--explore`)
    roles: dict[str, str] = field(default_factory=dict)  # session id → role, for the turns each role held
    cpu: tuple = ()  # CPU seconds during the presses: the server's, everything else's; and the seconds they took


def page_clock(page) -> float:
    """`perf_counter() - performance.now() / 1000` for `page`: the shortest of five round trips."""
    readings = []
    for _ in range(5):
        before = time.perf_counter()
        now = page.evaluate("performance.now()") / 1000
        after = time.perf_counter()
        readings.append((after - before, (before + after) / 2 - now))
    return min(readings)[1]


def open_teacher(browser, url: str, lang: str = "en"):
    """The teacher's page leading a room in `lang` (it loads that language's model); its Wire and the students'
    link's query."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    wire = Wire(page)
    page.goto(f"{url}/?lead=1&step=1" + ("&lang=zh" if lang == "zh" else ""), timeout=WAIT_S * 1000)
    settled_text(page)
    href = page.locator(".st-key-follow-link a").get_attribute("href")
    assert href and "follow=" in href, href
    return page, wire, urlsplit(href).query


def step_of(text: str) -> int:
    return int(re.search(r"\d+", text).group())


def join(
    url: str,
    seats: list[Seat],
    follow_query: str,
    prompts: dict,
    late_step: int,
    teacher_step: int,
    result: ClassRun,
    memory: ServerMemory,
) -> list[Student]:
    """The followers join one after another (each until it shows the teacher's step), then the explorers open
    their links all at once (until every one has drawn its step)."""
    students = []
    memory.phase, start = "followers join", time.perf_counter()
    for seat in (s for s in seats if s.role == "follower"):
        students.append(Student(url, link_for(seat, follow_query, "", late_step), seat))
        assert wait_for(lambda: students[-1].step_sent(0, teacher_step) and students[-1].ready(), WAIT_S), (
            f"a follower ({seat.lang}) never showed the teacher's step"
        )
    memory.phase, opened = "explorers open", time.perf_counter()
    explorers = [
        Student(url, link_for(s, follow_query, prompts.get(s), late_step), s) for s in seats if s.role != "follower"
    ]
    assert wait_for(lambda: all(e.ready() for e in explorers), OPEN_S, every=0.5), "an explorer's link never drew"
    result.joined_s = {"followers": opened - start, "explorers": time.perf_counter() - opened}
    heavy = next((e for e in explorers if e.seat.role == "heavy"), None)
    if heavy is not None:
        state, _ = parse_query({k: v[-1] for k, v in parse_qs(heavy.link).items()})
        result.heavy_link = f"block_size {state.block_size}, kv_splits {state.kv_splits}, step {state.step}"
    return students + explorers


def explore(student: Student, presses: int, first_at: float, pace: float, result: ClassRun) -> None:
    """An explorer's presses: each once the last one's run ended and `pace` s after the last one started."""
    at = first_at
    for _ in range(presses):
        time.sleep(max(0.0, at - time.perf_counter()))
        step = student.shown_step()
        sent = student.press_next()
        if sent is None:
            result.greyed += 1
            return
        shown = wait_for(lambda: student.step_sent(sent, step + 1), WAIT_S)
        ended = wait_for(lambda: student.finished_after(shown or sent), WAIT_S)
        if shown is None or ended is None:
            result.lost += 1
            result.errors.append(student.error or f"{student.seat} was not sent step {step + 1} in {WAIT_S} s")
            return
        result.explored[student.seat.role].append((1000 * (shown - sent), 1000 * (ended - sent)))
        sent_bytes = student.bytes_between(sent, ended)
        result.presses.append(Press(student.seat.role, student.session_id, sent, shown, sent_bytes))
        at = max(sent + pace, ended)


def teach(page, wire, followers: list[Student], presses: int, pace: float, result: ClassRun) -> None:
    """The teacher's presses, each `pace` s after the last (or once its followers were sent it, if later)."""
    page.locator("h1").first.click()
    clock = page_clock(page)
    at = time.perf_counter()
    for _ in range(presses):
        time.sleep(max(0.0, at - time.perf_counter()))
        result.teacher.append(press_step(page, wire))
        pressed = clock + page.evaluate("window.kvPress.start") / 1000
        step = step_of(counter(page))
        wait_for(lambda: all(f.step_sent(pressed, step) for f in followers), FOLLOW_S, every=0.05)
        result.lags.append(
            [None if (sent := f.step_sent(pressed, step)) is None else 1000 * (sent - pressed) for f in followers]
        )
        at = max(at + pace, time.perf_counter())


def run_class(root: Path, label: str, args, prompts: dict, late_step: int) -> ClassRun:
    result = ClassRun(label)
    log = Path(tempfile.gettempdir()) / f"kvscope-class-on-host-{label.split()[0]}.log"
    print(f"{label}: app of {root} (server log {log})", flush=True)
    with running_server(log, root=root) as (url, process), ServerMemory(process.pid) as memory, chromium() as browser:
        memory.phase = "models load"
        page, wire, follow_query = open_teacher(browser, url, args.langs[0])
        if args.langs[0] != "zh" and "zh" in args.langs:
            chinese = Student(url, "lang=zh&step=1", Seat("warm-up", "zh", 0))
            assert wait_for(chinese.ready, OPEN_S, every=0.2), "the Chinese model did not load"
            chinese.close()
        memory.phase = "idle"
        time.sleep(3)
        result.idle = memory.read()
        students = join(
            url,
            roster(args.students, args.langs),
            follow_query,
            prompts,
            late_step,
            step_of(counter(page)),
            result,
            memory,
        )
        memory.phase = "class"
        rng, start = random.Random(7), time.perf_counter()
        threads = [
            threading.Thread(
                target=explore,
                args=(s, args.presses, start + rng.uniform(0, args.pace), args.pace, result),
                daemon=True,
            )
            for s in students
            if s.seat.role != "follower"
        ]
        with CpuSplit(psutil.Process(process.pid)) as cpu:
            for thread in threads:
                thread.start()
            teach(page, wire, [s for s in students if s.seat.role == "follower"], args.presses, args.pace, result)
            for thread in threads:
                thread.join(timeout=WAIT_S * 2)
        result.cpu = (*cpu.used, time.perf_counter() - start)
        time.sleep(1)
        result.peak, result.class_peak, result.hwm = memory.peak(), memory.peak("class"), memory.read()["VmHWM"]
        result.joined_rss = memory.last("followers join")
        for student in students:
            student.close()
    report(result)
    return result


def open_and_explore(student: Student, opened_at: float, presses: int, result: ClassRun) -> None:
    """A student on their own: their page's opening time, then their presses, each as soon as the last one ended."""
    ready = wait_for(student.ready, OPEN_S, every=0.05)
    if ready is None:
        result.errors.append(student.error or f"{student.seat} did not open in {OPEN_S} s")
        return
    now = time.perf_counter()
    result.opened.setdefault(student.seat.role, []).append(1000 * (now - opened_at))
    explore(student, presses, now, 0.0, result)


def run_exploring_class(root: Path, label: str, args, prompts: dict, late_step: int) -> ClassRun:
    """`--explore`: the class opens its links at one moment (after one page per model loaded it) and explores."""
    result = ClassRun(label)
    log = Path(tempfile.gettempdir()) / f"kvscope-class-exploring-{label.split()[0]}.log"
    result.press_log = log.with_suffix(".presses.jsonl")
    result.press_log.unlink(missing_ok=True)
    print(f"{label}: app of {root} (server log {log})", flush=True)
    press_env = {"KVSCOPE_PRESS_LOG": str(result.press_log)}
    with running_server(log, press_env, root=root) as (url, process), ServerMemory(process.pid) as memory:
        memory.phase = "models load"
        for lang in args.langs:
            warm = Student(url, "step=1" + ("&lang=zh" if lang == "zh" else ""), Seat("warm-up", lang, 0))
            assert wait_for(warm.ready, OPEN_S, every=0.2), f"the {lang} model did not load"
            warm.close()
        memory.phase = "idle"
        time.sleep(3)
        result.idle = memory.read()
        seats = explorers_roster(args.students, args.langs)
        memory.phase = "class"
        start = time.perf_counter()
        with CpuSplit(psutil.Process(process.pid)) as cpu:
            students = [Student(url, link_for(s, "", prompts.get(s), late_step), s) for s in seats]
            threads = [
                threading.Thread(target=open_and_explore, args=(s, start, args.presses, result), daemon=True)
                for s in students
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=OPEN_S + WAIT_S * args.presses)
        result.cpu = (*cpu.used, time.perf_counter() - start)
        result.peak = result.class_peak = memory.peak()
        result.hwm = memory.read()["VmHWM"]
        result.joined_rss = result.idle
        result.roles = {s.session_id: s.seat.role for s in students}
        for student in students:
            student.close()
    report_exploring(result)
    return result


def exploring_rows(run: ClassRun) -> dict[str, str]:
    presses = sum(map(len, run.explored.values()))
    opens = sum(map(len, run.opened.values()))
    opened = lambda role: ms(run.opened.get(role, []))  # noqa: E731
    return {
        "server idle, both models loaded": memory_text(run.idle),
        "peak RSS (when)": peak_text(run.peak),
        "VmHWM, and of the host's 2.7 GiB": f"{run.hwm / MIB:.0f} MiB, {run.hwm * 1024 / LIMIT_BYTES:.0%}",
        "ordinary presses → step sent, p50 / p90": ms([shown for shown, _ in run.explored["light"]]),
        "eviction presses → step sent, p50 / p90": ms([shown for shown, _ in run.explored["evict"]]),
        "heavy presses → step sent, p50 / p90": ms([shown for shown, _ in run.explored["heavy"]]),
        "ordinary pages open, p50 / p90": opened("light"),
        "eviction pages open, p50 / p90": opened("evict"),
        "heavy pages open, p50 / p90": opened("heavy"),
        "server's CPU per open or press": f"{run.cpu[0] / max(1, presses + opens):.2f} s",
        "presses made / lost": f"{presses} / {run.lost}",
    }


def report_exploring(run: ClassRun) -> None:
    for error in run.errors:
        print(f"  lost: {error[:300]}")
    for name, value in exploring_rows(run).items():
        print(f"  {name:44s} {value}", flush=True)
    if run.press_log is not None and run.press_log.exists():
        print(f"  where presses went ({run.label}; ms, press → step sent):")
        print(press_parts.table(press_parts.breakdown(run.presses, run.press_log)), flush=True)
        print(f"  the turns pages held ({run.label}):")
        print(press_parts.turns_held(run.roles, run.press_log), flush=True)


# -- the figures ----------------------------------------------------------------------------------------------


def p50_p90(values: list[float]) -> tuple[float, float] | None:
    """Median and p90 (nearest rank) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return statistics.median(ordered), ordered[press_parts.nearest_rank(ordered, 0.9)]


def ms(values: list[float]) -> str:
    spread = p50_p90(values)
    return "—" if spread is None else f"{spread[0]:.0f} / {spread[1]:.0f} ms"


def memory_text(sample: dict[str, int]) -> str:
    return f"{sample['VmRSS'] / MIB:.0f} MiB (anon {sample['RssAnon'] / MIB:.0f} + file {sample['RssFile'] / MIB:.0f})"


def peak_text(peak: tuple) -> str:
    at, phase, sample = peak
    return f"{memory_text(sample)} at {at:.0f} s ({phase})"


def lag_parts(run: ClassRun) -> tuple[list[float], list[float], int]:
    """Every follower's lag, each press's last follower's, and how many were missed."""
    every = [lag for press in run.lags for lag in press if lag is not None]
    last = [max(lag for lag in press if lag is not None) for press in run.lags if any(lag is not None for lag in press)]
    return every, last, sum(lag is None for press in run.lags for lag in press)


def rows(run: ClassRun) -> dict[str, str]:
    every, last, missed = lag_parts(run)
    explored = run.explored["light"] + run.explored["heavy"]
    return {
        "server idle, both models loaded": memory_text(run.idle),
        "once the followers joined": memory_text(run.joined_rss),
        "peak RSS (when)": peak_text(run.peak),
        "peak RSS during the presses": peak_text(run.class_peak),
        "VmHWM, and of the host's 2.7 GiB": f"{run.hwm / MIB:.0f} MiB, {run.hwm * 1024 / LIMIT_BYTES:.0%}",
        "server's CPU during the presses (the rest)": f"{run.cpu[0] / run.cpu[2]:.2f} cores "
        f"({run.cpu[1] / run.cpu[2]:.2f}) of {psutil.cpu_count()}",
        "teacher → next token shown, p50 / p90": ms([t["token"] for t in run.teacher]),
        "teacher → step drawn, p50 / p90": ms([t["drawn"] for t in run.teacher]),
        "explorers → step sent, p50 / p90": ms([shown for shown, _ in explored]),
        "heavy explorers → step sent, p50 / p90": ms([shown for shown, _ in run.explored["heavy"]]),
        "explorers → run finished, p50 / p90": ms([ended for _, ended in explored]),
        "followers' lag, p50 / p90": ms(every),
        "last follower's lag, median / worst": "—"
        if not last
        else f"{statistics.median(last):.0f} / {max(last):.0f} ms" + (f" ({missed} missed)" if missed else ""),
    }


def report(run: ClassRun) -> None:
    print(
        f"  joined: followers in {run.joined_s['followers']:.1f} s, explorers' links drawn in "
        f"{run.joined_s['explorers']:.0f} s; heavy link as the host allows it: {run.heavy_link or '—'}"
    )
    print(
        f"  teacher presses {len(run.teacher)}; explorers' presses {sum(map(len, run.explored.values()))} "
        f"({run.greyed} explorers stopped at a greyed Next, {run.lost} presses lost)"
    )
    for error in run.errors:
        print(f"  lost: {error[:300]}")
    for name, value in rows(run).items():
        print(f"  {name:44s} {value}", flush=True)


def table(runs: list[ClassRun], exploring: bool = False) -> str:
    lines = ["| class on one host | " + " | ".join(run.label for run in runs) + " |", "|---|" + "---|" * len(runs)]
    by_run = [exploring_rows(run) if exploring else rows(run) for run in runs]
    return "\n".join(lines + [f"| {name} | " + " | ".join(r[name] for r in by_run) + " |" for name in by_run[0]])


@contextlib.contextmanager
def worktree(ref: str):
    """A `git worktree` of `ref` in a temporary folder; removed after."""
    with tempfile.TemporaryDirectory(prefix="kvscope-before-") as parent:
        folder = Path(parent) / "checkout"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True, capture_output=True
        )
        try:
            yield folder
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--presses", type=int, default=10, help="the teacher's presses (and each explorer's)")
    parser.add_argument("--pace", type=float, default=3.0, help="seconds between a student's presses")
    parser.add_argument(
        "--langs",
        type=lambda text: tuple(text.split(",")),
        default=("en", "zh"),
        help="the class's languages: en,zh (both models) or zh (embedded-zh alone)",
    )
    parser.add_argument("--before", help="a git ref to run the same class against first, in the same run")
    parser.add_argument("--explore", action="store_true", help="a class exploring on its own (no teacher)")
    args = parser.parse_args()
    limits = load_limits()
    late_step = max(1, limits.max_new_tokens - args.presses - 1)
    tokens = {lang: heaviest_prompt(limits, lang) for lang in args.langs}
    seats = explorers_roster(args.students, args.langs) if args.explore else roster(args.students, args.langs)
    prompts = {seat: exact_prompt(seat.lang, tokens[seat.lang], seat.number) for seat in seats if seat.role == "heavy"}
    print(
        f"{args.students} students: "
        + ", ".join(
            f"{sum(s.role == r and s.lang == lang for s in seats)} {r} {lang}"
            for r in ("follower", "light", "heavy", "evict")
            for lang in ("en", "zh")
        )
        + f"; {args.presses} presses every {args.pace:.0f} s; heavy links ask for a prompt of "
        + ", ".join(f"{count} tokens ({lang})" for lang, count in tokens.items())
        + ", "
        f"block_size 1, kv_splits {APP_MAX_KV_SPLITS}, step {late_step}; the servers' environment: "
        + (
            " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("KVSCOPE_"))
            or "no KVSCOPE_* (each checkout's defaults)"
        ),
        flush=True,
    )
    runs = []
    run = run_exploring_class if args.explore else run_class
    with contextlib.ExitStack() as stack:
        if args.before:
            sha = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            runs.append(
                run(
                    stack.enter_context(worktree(args.before)),
                    f"before ({args.before}, {sha})",
                    args,
                    prompts,
                    late_step,
                )
            )
        runs.append(run(ROOT, "after (this checkout)", args, prompts, late_step))
    print("\n" + table(runs, args.explore))


if __name__ == "__main__":
    main()
