"""Where a press spends its time (`ui.host.press_log`): a wait for a turn, a turn held, a wait for another page's
step of the same run, and the engine's and the figures' work are each written as one line the bench reads, on an
injected clock; nothing is written unless a file is named. Threads stand for page runs (as in tests/test_turns.py)."""

import itertools
import json
import threading

import pytest

from tests.test_turns import WAIT, Page, queued
from ui.host import press_log
from ui.runs import turns
from ui.runs.turns import EXPLORER, LEADER


@pytest.fixture
def log(tmp_path, monkeypatch):
    """The file the server's environment names, and a clock that moves 1.5 s at each reading."""
    path = tmp_path / "presses.jsonl"
    monkeypatch.setattr(press_log, "PATH", str(path))
    ticks = itertools.count()
    monkeypatch.setattr(press_log, "clock", lambda: 1.5 * next(ticks))
    return path


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_timed_block_is_one_line_of_its_part(log):
    with press_log.timed("engine"):
        pass
    assert lines(log) == [{"session": None, "part": "engine", "at": 0.0, "seconds": 1.5}]  # no script run: no session


def test_nothing_is_written_without_a_file(log, monkeypatch):
    monkeypatch.setattr(press_log, "PATH", None)
    with press_log.timed("figures"):
        pass
    press_log.record("turn", 0.0, 1.0)
    assert not log.exists()


def test_a_part_not_named_is_refused(log):
    with pytest.raises(ValueError, match="one of"):
        press_log.record("paint", 0.0, 1.0)


def test_an_explorer_waiting_behind_the_leader_records_its_wait_for_a_turn(log):
    leader = Page(LEADER)
    assert leader.began.wait(WAIT)
    explorer = Page(EXPLORER)
    queued(EXPLORER)
    assert not explorer.began.is_set()
    leader.done()
    assert explorer.began.wait(WAIT)
    explorer.done()
    parts = [line["part"] for line in lines(log)]
    assert parts == ["turn held", "turn", "turn held"]  # the leader's turn, the wait behind it, the explorer's turn
    leader_held, wait, _ = lines(log)
    given_back = leader_held["at"] + leader_held["seconds"]
    assert wait["at"] < given_back <= wait["at"] + wait["seconds"]  # it waited until the leader gave its turn back


def test_a_turn_taken_at_once_records_no_wait_only_its_holding(log):
    with turns.turn(EXPLORER):
        pass
    assert [(line["part"], line["seconds"]) for line in lines(log)] == [("turn held", 1.5)]


def test_a_wait_for_a_lock_another_page_holds_is_a_run_lock_stretch(log, monkeypatch):
    lock, taken, release = threading.Lock(), threading.Event(), threading.Event()
    with press_log.held(lock):  # free: nothing recorded
        pass
    assert lines(log) == [] and not lock.locked()

    def other_page():
        with lock:
            taken.set()
            release.wait(WAIT)

    holder = threading.Thread(target=other_page, daemon=True)
    holder.start()
    assert taken.wait(WAIT)
    ticks = itertools.count()

    def clock():  # its first reading starts the wait: the other page then ends its step
        release.set()
        return 1.5 * next(ticks)

    monkeypatch.setattr(press_log, "clock", clock)
    with press_log.held(lock):
        assert lock.locked()
    holder.join(WAIT)
    assert [(line["part"], line["seconds"]) for line in lines(log)] == [("run lock", 1.5)]
    assert not lock.locked()


def test_each_pass_of_a_page_run_is_one_engine_stretch(log, tiny_model):
    from tests.test_shared_runs import on_one_link

    (page,) = on_one_link(tiny_model("llama"), count=1)
    assert page.advance_to(4) == 4
    assert [line["part"] for line in lines(log)] == ["engine"] * 4  # the prefill, then three steps


def test_a_press_counts_each_instant_once_for_its_innermost_part():
    from bench.press_parts import Press, parts_of

    press = Press("light", "s", sent=10.0, shown=20.0, sent_bytes=0)
    record = [
        ("turn", 9.0, 11.0),  # waited since before the press: only its part inside the window counts
        ("engine", 11.0, 17.0),
        ("turn", 13.0, 15.0),  # the engine's pass shared its turn, and waited for it back
        ("figures", 18.0, 25.0),  # built past the header: cut at it
    ]
    assert parts_of(press, record) == {"turn": 3.0, "run lock": 0.0, "figures": 2.0, "engine": 4.0, "other": 1.0}


def test_a_slimmed_step_rebuilt_or_a_fresh_heatmap_shares_the_turn_between_layers(log, tiny_model, monkeypatch):
    """Work on a run besides its steps is long work too: on a heavy link a rebuild held its page's turn for 50 s."""
    from tests.test_shared_runs import on_one_link

    model = tiny_model("llama")
    (page,) = on_one_link(model, count=1)
    assert page.advance_to(12) == 12  # keep_full_traces=4: step 3 is slimmed
    run = page.run
    assert run.generation.traces[2].is_slim
    shared = []
    monkeypatch.setattr(turns, "share", lambda: shared.append("share"))
    assert not run.trace(3).is_slim
    assert len(shared) == model.info.layers  # one pass: a chance to give way after each layer
    run.full_attention(12, layer=0, head=0)
    assert len(shared) == 2 * model.info.layers
    assert [line["part"] for line in lines(log)][-2:] == ["engine", "engine"]
