"""The paged KV cache: a preallocated pool of fixed-size blocks and, per sequence, a block table.

What is stored: for every layer, each token's projected K and V (after RoPE and, in Qwen3, k_norm).
What is not: tokens, token ids, embeddings or hidden states.

In which dtype: the weights' (`Model.new_pool`; `ModelInfo.dtype`), so a bfloat16 model's cache is
bfloat16: 2 × 28 × 8 × 128 × 2 = 114,688 B per token for Qwen3-0.6B, half of float32's. Why not float32
for a bfloat16 model: K and V come out of bfloat16 projections, so float32 would store the same values
at twice the bytes; and transformers' own cache keeps the model's dtype, so the cached K/V equal its
bit for bit (tests/test_bf16.py) and the app's "KV bytes per token" is the articles' figure.

Block b holds the K/V of `block_size` consecutive positions; a sequence's block table maps its
logical block i (positions i·B … i·B+B−1) to a physical block anywhere in the pool, so the cache
grows a block at a time without ever copying what is already stored.

Threads: a pool's `lock` guards its bookkeeping only (ref counts, the free list and, for a prefix
cache's pool, the cache's index). Reading and writing K/V take no lock, so sessions sharing a pool run their
forward passes at once. That is safe because a session writes only positions past its table's
length, which lie in blocks it allocated itself (ref count 1, dropped from any index on allocation);
blocks it shares with others are full prompt blocks, below that length, so nobody writes them while
anyone holds them, and a block returns to the free list (where it can be reallocated and overwritten)
only when its last holder releases it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.errors import CacheFullError, InvalidSettingError


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """What the cache stores per token: 2 (K and V) × layers × kv_heads × head_dim × bytes per element."""
    return 2 * layers * kv_heads * head_dim * element_bytes


class BlockAllocator(Protocol):
    """Where a block table gets its blocks: a `BlockPool`, or a `PrefixCache` over one (which evicts
    what it cached when the pool hands out a block it still held)."""

    def require_free(self, count: int) -> None: ...

    def allocate(self) -> int: ...

    def release(self, block: int) -> None: ...


class BlockPool:
    """K and V storage for all layers: two tensors of shape (layers, blocks, block_size, kv_heads, head_dim).

    Free blocks wait in `free`, least recently used first, and allocation takes the front one. A block
    released with `cached=True` (a prefix cache still finds it) goes to the back, so it stays hittable
    as long as possible; an empty one goes to the front, to be reused first. The pool knows nothing of
    what a cache holds: the cache says so when it releases, and evicts when it allocates.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if not isinstance(block_size, int) or block_size < 1:
            raise InvalidSettingError(f"block_size must be an integer ≥ 1, got {block_size!r}")
        if num_blocks < 1:
            raise InvalidSettingError(f"num_blocks must be ≥ 1, got {num_blocks!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (layers, num_blocks, block_size, kv_heads, head_dim)
        # Uninitialised: only written slots are ever read, and untouched pages cost no resident memory,
        # so a large pool of which a session uses a little stays cheap.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.ref_count = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.lock = threading.RLock()  # held by callers around allocate/retain/release and index updates

    @property
    def bytes_per_token(self) -> int:
        layers, _, _, kv_heads, head_dim = self.k.shape
        return kv_bytes_per_token(layers, kv_heads, head_dim, self.k.element_size())

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def require_free(self, count: int, keeping: Iterable[int] = ()) -> None:
        """Raise CacheFullError unless `count` blocks can be allocated now: a caller checks before it
        changes anything, so a full pool leaves everything as it was (nothing is evicted).

        keeping: blocks the caller is about to retain (a cache hit); free ones among them cannot be allocated.
        """
        available = len(self.free) - sum(1 for block in set(keeping) if block in self.free)
        if count > available:
            raise CacheFullError(f"the KV pool is full: {count} more blocks are needed and {available} of "
                                 f"{self.num_blocks} are free; the others are in use by running sessions "
                                 "(or hold the cached prefix being reused)")

    def allocate(self) -> int:
        """The least recently used free block, now held once."""
        self.require_free(1)
        block, _ = self.free.popitem(last=False)
        self.ref_count[block] = 1
        return block

    def emptied(self, blocks: Iterable[int]) -> None:
        """Free `blocks` no cache holds any more go to the front of the free list, to be reused first."""
        for block in blocks:
            if block in self.free:
                self.free.move_to_end(block, last=False)

    def retain(self, block: int) -> None:
        """One more user of `block`; a cached free block leaves the free list (a cache hit)."""
        if self.ref_count[block] == 0:
            del self.free[block]
        self.ref_count[block] += 1

    def release(self, block: int, cached: bool = False) -> None:
        """One user fewer; at none the block is free: last in line when `cached`, else first."""
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free[block] = None
            if not cached:
                self.free.move_to_end(block, last=False)

    def copy_slots(self, source: list[int], target: list[int]) -> None:
        """Copy K/V of flat slots `source` into flat slots `target`, in every layer (no recomputation)."""
        layers, _, _, kv_heads, head_dim = self.k.shape
        src = torch.tensor(source, dtype=torch.long, device=self.k.device)
        dst = torch.tensor(target, dtype=torch.long, device=self.k.device)
        for cache in (self.k, self.v):
            flat = cache.view(layers, -1, kv_heads, head_dim)
            flat[:, dst] = flat[:, src]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (T, kv_heads, head_dim) at flat slots (T,) = block × block_size + offset."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)

    def read(self, layer: int, blocks: torch.Tensor, length: int,
             first: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `length` positions of the sequence whose block table is `blocks`.

        Returns two (length, kv_heads, head_dim) tensors, gathered block by block; when the table is
        one run of consecutive blocks starting at `first`, a view of them (nothing is copied).
        """
        if first is not None:
            count = blocks.shape[0]
            return (self.k[layer, first:first + count].flatten(0, 1)[:length],
                    self.v[layer, first:first + count].flatten(0, 1)[:length])
        k = self.k[layer].index_select(0, blocks).flatten(0, 1)[:length]
        v = self.v[layer].index_select(0, blocks).flatten(0, 1)[:length]
        return k, v


@dataclass
class BlockTable:
    """One sequence's logical → physical block map, plus how many positions are filled.

    Blocks come from `allocator` and go back to it: the pool itself, or a prefix cache over the pool.
    """

    pool: BlockPool
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    allocator: BlockAllocator | None = None  # None: the pool
    _device_blocks: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.allocator is None:
            self.allocator = self.pool

    def append(self, count: int) -> list[tuple[int, int]]:
        """Reserve the next `count` positions; return (physical block, offset) for each.

        All the blocks they need are checked for first: a full pool raises CacheFullError with the
        table unchanged. (If an allocation fails anyway, `roll_back` undoes what was added.)
        """
        size = self.pool.block_size
        self.allocator.require_free(self.blocks_needed(count))
        placed = []
        for position in range(self.length, self.length + count):
            if position // size == len(self.blocks):
                self.add(self.allocator.allocate())
            placed.append((self.blocks[position // size], position % size))
        self.length += count
        return placed

    def blocks_needed(self, count: int) -> int:
        """New blocks that `count` more positions need beyond the ones the table has."""
        size = self.pool.block_size
        return max(0, -(-(self.length + count) // size) - len(self.blocks))

    def mark(self) -> tuple[int, int]:
        """The table's extent now (blocks, positions), to `roll_back` to if what follows fails."""
        return len(self.blocks), self.length

    def roll_back(self, mark: tuple[int, int]) -> None:
        """Release the blocks added since `mark` (last first) and forget the positions reserved since.

        A slot written past the restored length is never read: the next append reserves it again.
        """
        count, length = mark
        for block in reversed(self.blocks[count:]):
            self.allocator.release(block)
        del self.blocks[count:]
        self.length = length
        self._device_blocks = None

    def add(self, block: int) -> None:
        """Append a physical block the caller already holds a reference to."""
        self.blocks.append(block)
        self._device_blocks = None

    def device_blocks(self) -> torch.Tensor:
        if self._device_blocks is None:
            self._device_blocks = torch.tensor(self.blocks, dtype=torch.long, device=self.pool.k.device)
        return self._device_blocks

    def first_of_run(self) -> int | None:
        """The first block when the table is consecutive physical blocks (then reads need no gather)."""
        if self.blocks and self.blocks == list(range(self.blocks[0], self.blocks[0] + len(self.blocks))):
            return self.blocks[0]
        return None

    def slots(self, placed: list[tuple[int, int]]) -> torch.Tensor:
        size = self.pool.block_size
        return torch.tensor([b * size + o for b, o in placed], dtype=torch.long, device=self.pool.k.device)

    def free(self) -> None:
        # Last blocks first, so a sequence's tail is evicted before the prefix others may share.
        for block in reversed(self.blocks):
            self.allocator.release(block)
        self.blocks = []
        self.length = 0
        self._device_blocks = None
