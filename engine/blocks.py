"""The one owner of a pool's blocks: how many holders each block has (its reference count), which blocks are free
and in what order, and the full blocks by chained hash. A `BlockPool` (engine.kv_cache) stores the K/V and has one
of these; the generations' tables and prefix cache (engine.prefix_cache) and the server's scheduler
(engine.scheduler) all take, share and give back blocks through it.

The order is nano-vllm's (its engine/block_manager.py; bench/nanovllm_peer.py compares both uses with it): a block
given back goes last in the free list and a new one is taken from the front, so a free block stays findable by its
hash as long as possible; a hit on a free block takes it out of the list. A block keeps its hash until it is taken
again; when a later block is filled with the same tokens after the same parent, the hash names the later block.

A sliding-window pool's manager (`freed_first`) takes the block given back last first instead: nothing finds its
blocks by hash, and reusing the same few keeps the memory its layers touch at the window's size.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable

from engine.checks import require_integer
from engine.errors import CacheFullError


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, freed_first: bool = False):
        require_integer("num_blocks", num_blocks, 1)
        require_integer("block_size", block_size, 1)
        self.num_blocks, self.block_size, self.freed_first = num_blocks, block_size, freed_first
        self.ref_count = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}  # a full block's chained hash, kept until the block is taken again
        self.on_reclaim: Callable[[int], None] | None = None  # told first when a free block is taken again
        self.lock = threading.RLock()  # held by callers that share the pool, around every call here

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)

    def require_free(self, count: int, keeping: Iterable[int] = ()) -> None:
        """Raise CacheFullError unless `count` blocks can be taken now: a caller checks before it changes anything,
        so a full pool leaves everything as it was.

        keeping: blocks the caller is about to `retain` (a hit); free ones among them cannot also be taken.
        """
        available = len(self.free) - sum(1 for block in set(keeping) if block in self.free)
        if count > available:
            raise CacheFullError(
                f"the KV pool is full: {count} more blocks are needed and {available} of "
                f"{self.num_blocks} are free; the others are in use by running generations "
                "(or hold the cached prefix being reused)"
            )

    def allocate(self) -> int:
        """The first free block, now held once and hashed no more (its reclaimer told first)."""
        self.require_free(1)
        block, _ = self.free.popitem(last=False)
        if self.on_reclaim is not None:
            self.on_reclaim(block)
        self.unhash(block)
        self.ref_count[block] = 1
        return block

    def retain(self, block: int) -> None:
        """One more holder of `block`; a free one leaves the free list (a hit)."""
        if self.ref_count[block] == 0:
            del self.free[block]
        self.ref_count[block] += 1

    def release(self, block: int) -> None:
        """One holder fewer; at none the block goes last in the free list, still findable by its hash (first, when
        `freed_first`)."""
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free[block] = None
            if self.freed_first:
                self.free.move_to_end(block, last=False)

    # -- full blocks by chained hash ---------------------------------------------------------------------

    def find(self, key: bytes) -> int | None:
        return self.by_hash.get(key)

    def hashed(self, block: int) -> bool:
        """Whether a lookup by hash finds `block`."""
        key = self.hash_of.get(block)
        return key is not None and self.by_hash.get(key) == block

    def set_hash(self, block: int, key: bytes) -> int | None:
        """Name the full block `block` by `key`; returns the block `key` named before, when another."""
        before = self.by_hash.get(key)
        self.hash_of[block], self.by_hash[key] = key, block
        return before if before not in (None, block) else None

    def unhash(self, block: int) -> None:
        """A lookup by hash finds `block` no more."""
        key = self.hash_of.pop(block, None)
        if key is not None and self.by_hash.get(key) == block:
            del self.by_hash[key]


def block_hash(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block: its token ids chained with the parent block's key."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()
