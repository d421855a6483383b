"""Chapter 9's paging: a run replayed in a pool other requests used first lands on scattered physical blocks, and
the K/V read through that scattered table are exactly the run's own."""

import pytest
import torch

from engine.busy_pool import BusyPoolReplay
from tests.app_helpers import assert_clean, open_whole_view, start
from tests.runs import decode
from ui.lesson.chapters import CHAPTERS
from ui.state.link import parse_query
from ui.text.strings import figure_words
from viz.kv_cache import busy_pool_figure

PAGING = next(c for c in CHAPTERS if c.key == "paging")


def passes_of(session, traces):
    """The run's passes as the replay takes them: the whole prompt, then each decode step's token."""
    return [(session.prompt_ids, list(range(len(session.prompt_ids))))] + [
        (t.input_ids, t.positions) for t in traces[1:]
    ]


def contiguous(blocks: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(blocks, blocks[1:]))


def check_replay(model, prompt, block_size, steps, chat=False):
    session, traces = decode(model, prompt, steps, block_size=block_size, max_new_tokens=steps + 1, chat=chat)
    replay = BusyPoolReplay(model, passes_of(session, traces), block_size)
    table = replay.table.blocks
    assert contiguous(session.table.blocks) and not contiguous(table)  # its own pool: in order; the busy one: not
    assert len(table) == len(session.table.blocks) and replay.table.length == session.table.length
    assert not set(table) & set(replay.others)  # never a block another request still holds
    assert set(table[: len(replay.freed)]) <= set(replay.freed)  # the prompt went to the freed blocks first
    for layer in range(model.info.layers):
        ours, own = replay.kv(layer), session.table.read(layer)  # K, V and their first position
        assert torch.equal(ours[0], own[0]) and torch.equal(ours[1], own[1]) and ours[2] == own[2]
    picture = replay.picture(session.table.read)
    assert picture.kv_max_diff == 0 and picture.block_table == table
    session.close()
    return picture


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3", "gemma3"])
def test_a_replay_in_a_busy_pool_scatters_the_table_and_reads_the_runs_own_kv(tiny_model, family):
    # Gemma 3's window is shorter than this prompt: its local layers' tables have slid, in both pools alike.
    check_replay(tiny_model(family), "Paged attention stores the cache in blocks", 4, 6)


def test_the_embedded_model_in_chapter_9s_state(embedded_model):
    picture = check_replay(
        embedded_model, "What is a KV cache?", PAGING.settings["block_size"], PAGING.step - 1, chat=True
    )
    fig = busy_pool_figure(
        picture.block_table,
        picture.length,
        PAGING.settings["block_size"],
        picture.others,
        picture.num_blocks,
        words=figure_words("zh"),
    )
    labels = {a.text: a.x for a in fig.layout.annotations}
    assert labels == {f"L{logical}": physical for logical, physical in enumerate(picture.block_table)}
    mine = fig.data[1].z  # (slot, physical block): this request's logical block number, NaN elsewhere
    for logical, physical in enumerate(picture.block_table):
        assert all(z == logical for z in mine[:, physical][: picture.length - logical * 4])
    others = fig.data[0].z
    assert all((others[:, block] == 0).all() for block in picture.others)


def test_chapter_9_opens_on_the_busy_pool_with_a_scattered_table(embedded_model):
    at = open_whole_view(start(chapter=PAGING.number))  # the block table is in the view under the chapter
    assert_clean(at)
    state, _ = parse_query(dict(at.query_params.items()))
    assert state.pool == "busy" and at.radio(key="w_pool").value == "busy"
    words = figure_words("en")
    block_table = next(d.value for d in at.dataframe if words["bt_physical"] in d.value.columns)
    physical = [int(p) for p in block_table[words["bt_physical"]]]
    assert not contiguous(physical) and len(set(physical)) == len(physical)
