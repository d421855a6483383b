"""KVSCOPE_THREADS: the torch threads a page's passes compute with (one by default: faster on a shared server)."""

import pytest
import torch


@pytest.mark.parametrize("given, threads", [(None, 1), ("3", 3), ("0", 1), ("two", 1)])
def test_kvscope_threads_setting(given, threads):
    from ui.host.limits import load_limits

    assert load_limits({} if given is None else {"KVSCOPE_THREADS": given}).threads == threads


@pytest.mark.parametrize("setting, expected", [(None, 1), ("2", 2)])
def test_a_pages_passes_compute_with_the_hosts_threads(setting, expected, monkeypatch):
    """Every pass a page runs (the prefill on opening, a decode step on Next) runs with KVSCOPE_THREADS threads, in
    the script's own thread, whatever the process had before."""
    import engine.model
    from tests.app_helpers import assert_clean, start

    seen = []
    forward = engine.model.Model.forward

    def counted(self, ids, *args, **kwargs):
        seen.append((len(ids), torch.get_num_threads()))
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(engine.model.Model, "forward", counted)
    if setting is not None:
        monkeypatch.setenv("KVSCOPE_THREADS", setting)
    before = torch.get_num_threads()
    torch.set_num_threads(3 - expected)  # neither what the page should set nor left from an earlier test
    try:
        # A prompt of its own: a run other pages computed would be shared, with no pass to see.
        at = start(prompt=f"The cat sat on the mat, threads {setting}", chat=0, step=1, temperature=0)
        at.button(key="b_next").click().run()
    finally:
        torch.set_num_threads(before)
    assert_clean(at)
    assert any(n > 1 for n, _ in seen) and any(n == 1 for n, _ in seen), seen  # a prefill and a decode step
    assert {threads for _, threads in seen} == {expected}, seen
