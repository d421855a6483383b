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

Sliding-window layers (Gemma 3: 15 of 18 layers read only the last `sliding_window` positions) keep their
K/V apart: a pool built with per-layer `windows` stores its global layers itself and its local layers in a
second pool, `pool.window`, with its own blocks and free list; every table over such a pool has a second
table, `table.window`, appended in step with it. After each pass the window table hands back the blocks
whose positions no later query can see (all before length − sliding_window + 1), so a local layer holds at
most ⌈(sliding_window − 1) / block_size⌉ + 1 blocks, a global one all. A pass over T new positions writes
all T first (its own queries need them), then the step drops what fell out of the window.

Blocks: which are held, by how many, which are free and in what order, is the pool's `block_manager`'s
(engine.blocks), the one owner of blocks; a table takes and gives back its blocks there.

Threads: the block manager's `lock` guards the bookkeeping only (ref counts, the free list and, for a prefix
cache's pool, the cache's index). Reading and writing K/V take no lock, so generations sharing a pool run their
forward passes at once. That is safe because a generation writes only positions past its table's
length, which lie in blocks it allocated itself (ref count 1, dropped from any index on allocation);
blocks it shares with others are full prompt blocks, below that length, so nobody writes them while
anyone holds them, and a block returns to the free list (where it can be reallocated and overwritten)
only when its last holder releases it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.blocks import BlockManager
from engine.errors import InvalidSettingError

DEFAULT_BLOCK_SIZE = 16  # positions per KV block when neither the caller nor a prefix cache says


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """What the cache stores per token: 2 (K and V) × layers × kv_heads × head_dim × bytes per element."""
    return 2 * layers * kv_heads * head_dim * element_bytes


class BlockPool:
    """K and V storage for all layers: two tensors of shape (layers, blocks, block_size, kv_heads, head_dim), and
    the `block_manager` that owns those blocks."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        windows: Sequence[int | None] | None = None,
        freed_first: bool = False,
    ):
        """`layers` K/V layers; with `windows` (one per layer, None for a global layer, else its sliding
        window) the local layers go to `self.window`, a pool of their own (see the module's docstring)."""
        self.block_manager = BlockManager(num_blocks, block_size, freed_first=freed_first)  # checks both
        self.block_size = block_size
        self.num_blocks = num_blocks
        windows = list(windows) if windows is not None else [None] * layers
        local = [w for w in windows if w is not None]
        if len(set(local)) > 1:
            raise InvalidSettingError(f"one sliding window for all local layers is supported, got {sorted(set(local))}")
        self.window_size: int | None = local[0] if local else None
        # Model layer → (is it local, its row in the pool that stores it).
        counts = {False: 0, True: 0}
        self.rows: list[tuple[bool, int]] = []
        for w in windows:
            self.rows.append((w is not None, counts[w is not None]))
            counts[w is not None] += 1
        self.window: BlockPool | None = (
            BlockPool(counts[True], kv_heads, head_dim, num_blocks, block_size, dtype, device, freed_first=True)
            if local
            else None
        )
        layers = counts[False]
        shape = (layers, num_blocks, block_size, kv_heads, head_dim)
        # Uninitialised: only written slots are ever read, and untouched pages cost no resident memory,
        # so a large pool of which a generation uses a little stays cheap.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def bytes_per_token(self) -> int:
        """What one position costs in every layer that keeps it (the window pool's layers included)."""
        layers, _, _, kv_heads, head_dim = self.k.shape
        own = kv_bytes_per_token(layers, kv_heads, head_dim, self.k.element_size())
        return own + (self.window.bytes_per_token if self.window is not None else 0)

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

    def read(
        self, layer: int, blocks: torch.Tensor, length: int, first: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `length` positions of the sequence whose block table is `blocks`.

        Returns two (length, kv_heads, head_dim) tensors, gathered block by block; when the table is
        one run of consecutive blocks starting at `first`, a view of them (nothing is copied).
        """
        if first is not None:
            count = blocks.shape[0]
            return (
                self.k[layer, first : first + count].flatten(0, 1)[:length],
                self.v[layer, first : first + count].flatten(0, 1)[:length],
            )
        k = self.k[layer].index_select(0, blocks).flatten(0, 1)[:length]
        v = self.v[layer].index_select(0, blocks).flatten(0, 1)[:length]
        return k, v


@dataclass
class BlockTable:
    """One sequence's logical → physical block map, plus how many positions are filled.

    Blocks are taken from the pool's block manager and given back to it.
    Over a pool with sliding-window layers, `window` is the table of those layers (in `pool.window`):
    appended in step with this one; its first `dropped` logical blocks were handed back (`slide`).
    """

    pool: BlockPool
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    window: BlockTable | None = None
    dropped: int = 0  # leading logical blocks handed back: `blocks[i]` is logical block dropped + i
    _device_blocks: torch.Tensor | None = None

    @property
    def block_manager(self) -> BlockManager:
        return self.pool.block_manager

    def __post_init__(self) -> None:
        if self.window is None and self.pool.window is not None:
            self.window = BlockTable(self.pool.window, length=self.length)

    @property
    def first_position(self) -> int:
        """The first position whose K/V the table still holds (0 unless blocks were handed back)."""
        return self.dropped * self.pool.block_size

    def append(self, count: int) -> list[tuple[int, int]]:
        """Reserve the next `count` positions; return (physical block, offset) for each.

        All the blocks they need are checked for first (the window table's too): a full pool raises
        CacheFullError with the table unchanged. (If an allocation fails anyway, `roll_back` undoes what was added.)
        """
        size = self.pool.block_size
        self.block_manager.require_free(self.blocks_needed(count))
        if self.window is not None:
            self.window.block_manager.require_free(self.window.blocks_needed(count))
        placed = []
        for position in range(self.length, self.length + count):
            if position // size == self.dropped + len(self.blocks):
                self.add(self.block_manager.allocate())
            placed.append((self.blocks[position // size - self.dropped], position % size))
        self.length += count
        if self.window is not None:
            self.window.append(count)
        return placed

    def fork(self) -> BlockTable:
        """A second table over the same pool holding the same positions, to be extended on its own (several runs of
        one prompt): every full block is shared (one more reference each), the partly filled last block is copied
        into a block of the twin's own, so neither table's appends write into the other's positions."""
        size = self.pool.block_size
        tail = self.length % size  # positions filled in a partly filled last block
        shared = self.blocks[:-1] if tail else list(self.blocks)
        self.block_manager.require_free(1 if tail else 0)
        twin = BlockTable(
            self.pool,
            [],
            self.length,
            dropped=self.dropped,
            window=self.window.fork() if self.window is not None else None,
        )
        for block in shared:
            self.block_manager.retain(block)
            twin.add(block)
        if tail:
            block, last = self.block_manager.allocate(), self.blocks[-1]
            self.pool.copy_slots([last * size + i for i in range(tail)], [block * size + i for i in range(tail)])
            twin.add(block)
        return twin

    def blocks_needed(self, count: int) -> int:
        """New blocks that `count` more positions need beyond the ones the table has."""
        size = self.pool.block_size
        return max(0, -(-(self.length + count) // size) - self.dropped - len(self.blocks))

    def mark(self) -> int:
        """The table's extent now (its length), to `roll_back` to."""
        return self.length

    def roll_back(self, mark: int) -> list[int]:
        """Forget the positions from `mark` (a length) on and release the blocks they alone used, last first (the
        window table's too); returns this table's blocks released. A step undone after an error, and the rows a
        verify pass wrote for guesses it rejected (`engine.speculative`), go this way.

        A slot written past the restored length is never read: the next append reserves it again.
        """
        keep = max(0, -(-mark // self.pool.block_size) - self.dropped)
        released = self.blocks[keep:]
        for block in reversed(released):
            self.block_manager.release(block)
        del self.blocks[keep:]
        self.length = mark
        self._device_blocks = None
        if self.window is not None:
            self.window.roll_back(mark)
        return released

    def slide(self) -> list[int]:
        """Hand back the window table's blocks that no later query can see (every position in them is
        before length − sliding_window + 1); the blocks handed back, oldest first. A table without
        sliding-window layers keeps everything."""
        table = self.window
        if table is None:
            return []
        size, reach = table.pool.block_size, self.length - self.pool.window_size + 1
        gone = []
        while table.blocks and (table.dropped + 1) * size <= reach:
            gone.append(table.blocks.pop(0))
            table.block_manager.release(gone[-1])
            table.dropped += 1
        table._device_blocks = None
        return gone

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

    def slots_at(self, positions: list[int]) -> torch.Tensor:
        """The flat slots of `positions` (which the table holds)."""
        size = self.pool.block_size
        return self.slots([(self.blocks[p // size - self.dropped], p % size) for p in positions])

    def read(self, layer: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """K and V of model layer `layer` at the positions the table holds for it, up to `length` (default:
        all): (n, kv_heads, head_dim) each, and the first position they start at (0 for a global layer)."""
        length = self.length if length is None else length
        local, row = self.pool.rows[layer]
        table = self.window if local else self
        start = table.first_position
        k, v = table.pool.read(row, table.device_blocks(), length - start, table.first_of_run())
        return k, v, start

    def free(self) -> None:
        # Last blocks first, so a sequence's tail is taken again before the prefix others may share.
        for block in reversed(self.blocks):
            self.block_manager.release(block)
        self.blocks = []
        self.length = 0
        self.dropped = 0
        self._device_blocks = None
        if self.window is not None:
            self.window.free()
