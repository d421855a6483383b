"""Runs shared between pages: one computation per (settings, prompt history), forks on a change, a bounded store."""

import threading

import pytest
import torch

import engine
from tests.app_helpers import shown_text, start
from tests.test_runner import config
from ui.runs.runner import Runner
from ui.runs.store import RunStore


class EngineCalls:
    """Counts the engine's prefills and decode steps (of runs, not of the seed prompts' cache fills)."""

    def __init__(self, monkeypatch):
        self.prefills = self.steps = 0
        prefill, step = engine.Generation.prefill, engine.Generation.step

        def counted_prefill(generation):
            self.prefills += generation.max_new_tokens > 1  # a seed prompt's prefill asks for one token
            return prefill(generation)

        def counted_step(generation):
            self.steps += 1
            return step(generation)

        monkeypatch.setattr(engine.Generation, "prefill", counted_prefill)
        monkeypatch.setattr(engine.Generation, "step", counted_step)


def pages(model, store, count=2):
    return [Runner(model, cache_tokens=256, keep_full_traces=4, runs=store) for _ in range(count)]


def on_one_link(model, count=2):
    """`count` pages of one store, each configured with the same link's settings."""
    runners = pages(model, RunStore(10**9), count)
    for page in runners:
        page.configure(config())
    return runners


def test_pages_with_the_same_settings_read_one_run(tiny_model, monkeypatch):
    model, store = tiny_model("llama"), RunStore(10**9)
    calls = EngineCalls(monkeypatch)
    first, second = pages(model, store)
    for page in (first, second):
        page.configure(config())
        assert page.advance_to(6) == 6
    assert first.run is second.run and store.built == 1
    assert (calls.prefills, calls.steps) == (1, 5)  # the second page computed nothing
    alone = engine.Generation(model, config().prompt, sampling=config().sampling, block_size=4, max_new_tokens=40)
    alone.prefill()
    for _ in range(5):
        alone.step()
    assert second.cells(6) == first.cells(6) and [c.token_id for c in first.cells(6)][-6:] == alone.generated


def test_stepping_past_the_end_extends_the_run_for_every_page(tiny_model, monkeypatch):
    calls = EngineCalls(monkeypatch)
    leader, student = on_one_link(tiny_model("llama"))
    student.advance_to(3)
    leader.advance_to(9)
    assert student.generated == 9  # the student's run is the same one, now nine tokens long
    assert student.advance_to(9) == 9 and calls.steps == 8  # and nothing was computed twice


def test_a_changed_setting_forks_and_the_other_page_keeps_its_run(tiny_model):
    model, store = tiny_model("llama"), RunStore(10**9)
    first, second = pages(model, store)
    for page in (first, second):
        page.configure(config())
        page.advance_to(4)
    shared = first.run
    second.configure(config(sampling=engine.Sampling(temperature=1.0, seed=5)))
    second.advance_to(4)
    assert second.run is not shared and first.run is shared and store.built == 2
    assert shared.generation.generated[:4] == first.generation.generated[:4] and not shared.closed


def test_a_page_prompt_history_is_part_of_what_it_shares(tiny_model):
    """A prefix-cache hit depends on what the page published before: pages share a run only with the same history."""
    model, store = tiny_model("llama"), RunStore(10**9)
    first, second, fresh = pages(model, store, 3)
    cached, edited = "The cat sat on the warm mat today", "The cat sat on the warm mat tonight"
    for page in (first, second):
        page.configure(config(prompt=cached))
        page.advance_to(1)  # the prefill publishes the prompt when the page leaves it
        page.configure(config(prompt=edited))
        page.advance_to(1)
    fresh.configure(config(prompt=edited))
    fresh.advance_to(1)
    assert first.run is second.run and fresh.run is not first.run
    assert first.prefix_hit().reused_tokens > 0 and fresh.prefix_hit().reused_tokens == 0
    # the hit is the one a prefix cache holding the earlier prompt gives
    cache = engine.PrefixCache(model, policy="radix", block_size=4, capacity_blocks=200)
    with engine.Generation(model, cached, prefix_cache=cache) as before:
        before.prefill()
    with engine.Generation(model, edited, prefix_cache=cache, sampling=config().sampling) as after:
        hit = after.prefill().prefix
    assert first.prefix_hit() == hit


def test_a_page_that_did_not_see_the_prefill_publishes_nothing(tiny_model):
    stepping, looking = on_one_link(tiny_model("llama"))
    stepping.advance_to(2)  # the shared run is prefilled, but `looking` stayed at step 0
    looking.configure(config(prompt="Something else entirely"))
    assert looking.history.prompts == [] and looking.run.seeds == ()


def test_the_store_drops_the_least_recently_used_runs_beyond_its_bytes(tiny_model):
    model = tiny_model("llama")
    probe = RunStore(10**9)
    (page,) = pages(model, probe, 1)
    page.configure(config(prompt="prompt 0"))
    page.advance_to(5)
    one_run = page.run.nbytes
    assert one_run > 0
    store = RunStore(int(2.5 * one_run))
    keep, *others = pages(model, store, 4)
    keep.configure(config(prompt="prompt 0"))
    keep.advance_to(5)
    for n, other in enumerate(others, 1):
        other.configure(config(prompt=f"prompt {n}"))
        other.advance_to(5)
    prompts = [key[0].prompt for key in store.keys]
    assert prompts == ["prompt 2", "prompt 3"]  # two fit; the oldest went first
    assert keep.advance_to(6) == 6 and keep.trace(6) is not None  # a page keeps the run it reads
    again = pages(model, store, 1)[0]
    again.configure(config(prompt="prompt 0"))
    assert again.run is not keep.run and store.built == 5  # dropped: built again for a new page


def test_a_step_drawn_while_another_page_extends_the_run_keeps_its_tensors(tiny_model):
    reader, stepper = on_one_link(tiny_model("llama"))
    reader.advance_to(3)
    drawn = reader.trace(3)
    stepper.advance_to(12)  # keep_full_traces=4: step 3 is slimmed in the run
    assert reader.run.generation.traces[2].is_slim
    assert drawn.logits is not None and drawn.attention is not None  # the page's copy is whole
    rebuilt = reader.trace(3)  # a later draw rebuilds it, once for every page
    torch.testing.assert_close(rebuilt.logits, drawn.logits, atol=1e-5, rtol=0)
    assert stepper.trace(3) is rebuilt


def test_pages_asking_at_once_wait_for_one_build(tiny_model, monkeypatch):
    model, store = tiny_model("llama"), RunStore(10**9)
    calls = EngineCalls(monkeypatch)
    runners = pages(model, store, 8)
    threads = [threading.Thread(target=lambda r=r: (r.configure(config()), r.advance_to(10))) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.built == 1 and calls.prefills == 1 and calls.steps == 9
    assert len({id(r.run) for r in runners}) == 1


def test_two_browser_sessions_on_one_link_share_one_run(monkeypatch):
    calls = EngineCalls(monkeypatch)
    link = dict(prompt="Shared by the whole class", chat=0, step=5)
    first = start(**link)
    after_first = (calls.prefills, calls.steps)
    second = start(**link)
    assert not first.exception and not second.exception
    assert after_first[0] >= 1 and (calls.prefills, calls.steps) == after_first  # the second page computed nothing
    assert shown_text(second) == shown_text(first)
    assert first.session_state["page"].runner.run is second.session_state["page"].runner.run


def test_the_store_keeps_no_build_lock_for_keys_read_before_or_failed():
    """A key's build lock lives while the key is being asked for: a server that re-reads thousands of runs over a
    term does not keep a lock for each (hits, builds and failed builds alike), even with pages asking at once."""

    class Sized:
        nbytes = 1

    store = RunStore(10**9)

    def fail():
        raise ValueError("a prompt too long")

    def ask(key):
        for _ in range(20):
            store.get(key, Sized)

    threads = [threading.Thread(target=ask, args=(k % 5,)) for k in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key in range(5, 8):
        with pytest.raises(ValueError):
            store.get(key, fail)
    assert store.built == 5 and len(store.keys) == 5
    assert store._building == {}  # noqa: SLF001 — the leak this guards against lived there


def test_runs_no_page_asked_for_in_a_while_are_dropped_and_freed(tiny_model):
    """A class that left: its tabs' runs go from the store once idle (a page still reading keeps its run
    fresh), and nothing else holds them once the page is gone."""
    import gc
    import weakref

    from ui.host import memory

    now = [0.0]
    model, store = tiny_model("llama"), RunStore(10**9, idle_seconds=300, clock=lambda: now[0])
    stays, leaves = pages(model, store)
    stays.configure(config(prompt="stays"))
    leaves.configure(config(prompt="leaves"))
    left = weakref.ref(leaves.run)
    now[0] = 200.0
    stays.configure(config(prompt="stays"))  # an open page's next run reads its run
    now[0] = 301.0
    assert store.expire() == 1 and [key[0].prompt for key in store.keys] == ["stays"]
    del leaves  # the closed tab's session goes
    gc.collect()
    assert left() is None
    now[0] = 501.0
    assert store.expire() == 1 and store.keys == []
    assert stays.advance_to(2) == 2  # an open page keeps the run it holds, idle or not
    memory.sweep()  # the server's sweep runs without a Streamlit runtime too


def test_the_sweep_forgets_closed_tabs_sessions_then_runs_the_clean_ups(monkeypatch):
    """Streamlit 1.67 keeps a closed tab's session in a TTL cache that forgets it only when next written; the
    sweep expires it (through the runtime's session manager, as ui/host/streamlit_internals.py reaches it), then runs
    each clean-up."""
    import weakref
    from types import SimpleNamespace

    from cachetools import TTLCache
    from streamlit.runtime import Runtime
    from streamlit.runtime.memory_session_storage import MemorySessionStorage

    from ui.host import memory

    now = [0.0]
    storage = MemorySessionStorage()
    storage._cache = TTLCache(maxsize=128, ttl=120, timer=lambda: now[0])  # Streamlit's TTL on a clock we move

    class Session:  # what a kept session holds: its page's run, among the rest
        id = "closed tab"

    session = Session()
    storage.save(SimpleNamespace(session=session))
    kept = weakref.ref(session)
    del session
    runtime = SimpleNamespace(_session_mgr=SimpleNamespace(_session_storage=storage))
    monkeypatch.setattr(Runtime, "exists", staticmethod(lambda: True))
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: runtime))
    cleaned = []
    monkeypatch.setattr(memory, "_sweeps", [lambda: cleaned.append(1) or 0])
    now[0] = 121.0  # expired, yet held until the cache is next touched
    assert kept() is not None
    memory.sweep()
    assert kept() is None and cleaned == [1]


def test_streamlit_keeps_closed_sessions_where_the_sweep_looks():
    """The pinned Streamlit's session manager holds its storage as `_session_storage` (ui/host/memory.py)."""
    import inspect

    from streamlit.runtime.websocket_session_manager import WebsocketSessionManager

    assert "self._session_storage = session_storage" in inspect.getsource(WebsocketSessionManager.__init__)
