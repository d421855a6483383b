"""The paged KV cache: a preallocated pool of fixed-size blocks and, per sequence, a block table.

What is stored: for every layer, each token's projected K and V (after RoPE and, in Qwen3, k_norm).
What is not: tokens, token ids, embeddings or hidden states.

Block b holds the K/V of `block_size` consecutive positions; a sequence's block table maps its
logical block i (positions i·B … i·B+B−1) to a physical block anywhere in the pool, so the cache
grows a block at a time without ever copying what is already stored.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from engine.errors import InvalidSettingError


class BlockPool:
    """K and V storage for all layers: two tensors of shape (layers, blocks, block_size, kv_heads, head_dim)."""

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
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.ref_count = [0] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) × layers × kv_heads × head_dim × bytes per element."""
        layers, _, _, kv_heads, head_dim = self.k.shape
        return 2 * layers * kv_heads * head_dim * self.k.element_size()

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise MemoryError(f"KV pool is full: all {self.num_blocks} blocks are in use")
        block = self.free.popleft()
        self.ref_count[block] = 1
        return block

    def retain(self, block: int) -> None:
        self.ref_count[block] += 1

    def release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free.append(block)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (T, kv_heads, head_dim) at flat slots (T,) = block × block_size + offset."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)

    def read(self, layer: int, blocks: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `length` positions of the sequence whose block table is `blocks`.

        Returns two (length, kv_heads, head_dim) tensors, gathered block by block.
        """
        k = self.k[layer].index_select(0, blocks).flatten(0, 1)[:length]
        v = self.v[layer].index_select(0, blocks).flatten(0, 1)[:length]
        return k, v


@dataclass
class BlockTable:
    """One sequence's logical → physical block map, plus how many positions are filled."""

    pool: BlockPool
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    _device_blocks: torch.Tensor | None = None

    def append(self, count: int) -> list[tuple[int, int]]:
        """Reserve the next `count` positions; return (physical block, offset) for each."""
        size = self.pool.block_size
        placed = []
        for position in range(self.length, self.length + count):
            if position // size == len(self.blocks):
                self.blocks.append(self.pool.allocate())
                self._device_blocks = None
            placed.append((self.blocks[position // size], position % size))
        self.length += count
        return placed

    def device_blocks(self) -> torch.Tensor:
        if self._device_blocks is None:
            self._device_blocks = torch.tensor(self.blocks, dtype=torch.long, device=self.pool.k.device)
        return self._device_blocks

    def slots(self, placed: list[tuple[int, int]]) -> torch.Tensor:
        size = self.pool.block_size
        return torch.tensor([b * size + o for b, o in placed], dtype=torch.long, device=self.pool.k.device)

    def free(self) -> None:
        for block in self.blocks:
            self.pool.release(block)
        self.blocks = []
        self.length = 0
        self._device_blocks = None
