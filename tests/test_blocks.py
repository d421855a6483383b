"""The one owner of blocks (engine/blocks.py): nano-vllm's order of the free list, hashes kept until a block is taken
again, a later block taking over a hash, the reclaimer told first; and no other module of the engine keeps a
reference count or a free list. bench/nanovllm_peer.py compares the order with nano-vllm's own block manager."""

import re
from pathlib import Path

import pytest

from engine.blocks import BlockManager
from engine.errors import CacheFullError, InvalidSettingError

ENGINE = Path(__file__).resolve().parent.parent / "engine"


def test_a_block_given_back_goes_last_and_a_hit_on_a_free_block_takes_it_out():
    manager = BlockManager(4, 2)
    first, second = manager.allocate(), manager.allocate()
    assert (first, second) == (0, 1)
    manager.release(second)
    manager.release(first)
    assert list(manager.free) == [2, 3, 1, 0], "freed blocks wait behind the never-used ones, in the order freed"
    manager.retain(1)
    assert list(manager.free) == [2, 3, 0] and manager.ref_count[1] == 1
    manager.retain(1)
    manager.release(1)
    assert manager.ref_count[1] == 1 and 1 not in manager.free, "a block is free only when its last holder leaves"
    assert manager.used == 1


def test_a_window_pool_takes_the_block_freed_last_first():
    manager = BlockManager(4, 2, freed_first=True)
    blocks = [manager.allocate() for _ in range(3)]
    for block in blocks:
        manager.release(block)
    assert list(manager.free) == [2, 1, 0, 3]


def test_a_hash_lasts_until_the_block_is_taken_again_and_a_later_block_takes_it_over():
    manager = BlockManager(3, 2)
    a = manager.allocate()
    assert manager.set_hash(a, b"k") is None
    manager.release(a)
    assert manager.find(b"k") == a and manager.hashed(a), "a free block is still found"
    b = manager.allocate()
    assert manager.set_hash(b, b"k") == a, "the later block takes the hash over"
    assert manager.find(b"k") == b and not manager.hashed(a)
    assert manager.hash_of[a] == b"k", "a's own key stays (a later block of its chain hashes from it)"
    told = []
    manager.on_reclaim = lambda block: told.append((block, manager.hashed(block)))
    manager.release(b)
    assert [manager.allocate(), manager.allocate()] == [2, a]
    assert manager.allocate() == b
    assert told == [(2, False), (a, False), (b, True)], "told while its hash still finds it"
    assert manager.find(b"k") is None and not manager.hash_of


def test_a_full_manager_changes_nothing_and_says_why():
    manager = BlockManager(2, 4)
    held = manager.allocate()
    manager.release(held)
    manager.allocate()
    with pytest.raises(CacheFullError, match="2 more blocks are needed and 1 of 2 are free"):
        manager.require_free(2)
    with pytest.raises(CacheFullError, match="1 more blocks are needed and 0 of 2 are free"):
        manager.require_free(1, keeping=[held])  # the free block is about to be retained, not taken
    assert list(manager.free) == [held]


@pytest.mark.parametrize("args", [(0, 4), (4, 0), (True, 4), (4, 2.0)])
def test_bad_sizes_are_refused(args):
    with pytest.raises(InvalidSettingError):
        BlockManager(*args)


def test_no_other_module_of_the_engine_keeps_a_reference_count_or_a_free_list():
    """A count is kept where it is written (`ref_count … =`, `+=`, `-=`), a free list where one is made."""
    writes = re.compile(r"(ref_?count\w*(\[[^]\n]*\])?\s*[-+]?=(?!=))|(deque|OrderedDict)\b[^\n]*range\(")
    keeping = {
        str(p.relative_to(ENGINE))
        for p in ENGINE.rglob("*.py")
        if p.name != "blocks.py" and writes.search(p.read_text())
    }
    assert keeping == set()
