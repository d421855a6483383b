"""Prefix caching: reuse the K/V of an earlier prompt's leading tokens instead of recomputing them.

Only an exact token-id match from position 0 can be reused, and only prompt tokens are published
(an answer is sampled, so it is not shared). Three policies, because the sources disagree:

- "block" (vLLM): each full block is keyed by a hash chained with its parent block's hash; a lookup
  walks from block 0 and stops at the first miss. Reuse comes in whole blocks.
- "radix" (SGLang): a radix tree over token ids; reuse is the longest common prefix, token by token.
- "whole" (the source article): an entry is a whole earlier prompt; a new prompt reuses the longest
  entry that is a prefix of it, otherwise nothing.

At most n−1 tokens of an n-token prompt are reused: the last one must be computed to get logits.
Cached blocks live in the cache's `BlockPool`; when no generation uses them they wait in its block manager's free
list (engine.blocks), still hittable, until the manager hands one out again: then the cache *reclaims* it (drops it
from its index). The block policy's keys are the manager's own chained hashes, so a generation's prompt reuses blocks
as nano-vllm's block manager would (bench/nanovllm_peer.py --prefix).

Sliding-window layers (Gemma 3) keep their K/V in the pool's window pool, and hand blocks back as the
window passes them. The rule, the simplest that stays exact: a published prompt block keeps its twin,
the window layers' block of the same positions, if the generation still held it when it closed (the cache
holds a reference to the twin until the block is evicted); a lookup reuses only positions whose block has
a twin. So a prompt no longer than the window is reused as on any model, and the leading blocks of a
longer one (handed back during its prefill) end every lookup there: nothing is reused.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.blocks import BlockManager
from engine.checks import require_integer
from engine.errors import InvalidSettingError
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, BlockTable
from engine.prefix_index import common_prefix_length, new_index
from engine.trace import PrefixHit

REUSE_POLICIES = ("block", "radix", "whole")


@dataclass(frozen=True)
class PoolState:
    """A pool's size and what a lookup can still hit, as the views show it."""

    block_size: int
    blocks: int
    cached_free: int  # free blocks a prefix-cache lookup can still hit


@dataclass(frozen=True)
class BlockReclaim:
    """A cached block handed out again for new K/V: the cache found it no more."""

    block: int
    policy: str


class PrefixCache:
    """The one owner of prefix caching: a bounded pool of K/V blocks shared by the generations that use
    this cache, and the prefix index over its blocks (a block its manager hands out again is first reclaimed:
    dropped from the index)."""

    def __init__(self, model, policy: str = "block", block_size: int = DEFAULT_BLOCK_SIZE, capacity_blocks: int = 512):
        if policy not in REUSE_POLICIES:
            raise InvalidSettingError(
                f"unknown prefix-cache policy {policy!r}; choose one of {', '.join(REUSE_POLICIES)}"
            )
        require_integer("capacity_blocks", capacity_blocks, 1)
        self.model = model
        self.policy = policy
        self.pool: BlockPool = model.new_pool(capacity_blocks, block_size)
        self.block_size = block_size
        self.block_manager: BlockManager = self.pool.block_manager
        self.index = new_index(policy, self.block_manager)
        self.block_manager.on_reclaim = self._reclaim
        self.reclaims: deque[BlockReclaim] = deque(maxlen=1000)
        self._unreported: list[int] = []
        self.twins: dict[int, int] = {}  # cached block → the window pool's block of the same positions

    def _reclaim(self, block: int) -> None:
        """The manager hands out `block` (with its lock held): if the index holds it, it holds it no more."""
        if not self.index.holds(block):
            return
        # Forgetting one block can drop others from the index (the radix subtree below it, whole prompts stored in
        # it); their window twins go back with them.
        self._release_twins(self.index.forget(block))
        self.reclaims.append(BlockReclaim(block, self.policy))
        self._unreported.append(block)

    def _release_twins(self, blocks: Iterable[int]) -> None:
        for gone in set(blocks) & self.twins.keys():
            self.pool.window.block_manager.release(self.twins.pop(gone))

    # -- used by generations (with the pool's lock held) -----------------------------------------------------

    def attach(self, ids: list[int], table: BlockTable) -> PrefixHit:
        """Start `table` (empty) from the cached K/V of `ids`'s longest reusable prefix: whole blocks are
        shared, a partly reused block is copied into a new one. Returns the hit record.

        When the whole prompt cannot fit (copies plus the blocks of its computed positions),
        CacheFullError is raised before anything changes.
        """
        manager, size, n = self.block_manager, self.block_size, len(ids)
        per_token = self.lookup(ids)
        reused = len(per_token)
        segments = [per_token[start : start + size] for start in range(0, reused, size)]
        whole = [len(segment) == size and len(set(segment)) == 1 for segment in segments]
        sources = sorted(set(per_token))
        needed = whole.count(False) + math.ceil(n / size) - len(segments)
        manager.require_free(needed, keeping=sources)
        if self.pool.window is not None:
            self.pool.window.block_manager.require_free(needed)
        for block in sources:  # pin them: allocating a copy must not reclaim a block we read from
            manager.retain(block)
        shared, copied = [], []
        try:
            for segment, is_whole in zip(segments, whole):
                if is_whole:
                    manager.retain(segment[0])
                    table.add(segment[0])
                    shared.append(segment[0])
                else:
                    block = manager.allocate()
                    table.add(block)
                    copied.append(block)
                    self.pool.copy_slots(
                        [b * size + i for i, b in enumerate(segment)], [block * size + i for i in range(len(segment))]
                    )
                if table.window is not None:
                    self._attach_twins(segment, is_whole, table.window)
        finally:
            for block in sources:
                manager.release(block)
        table.length = reused
        if table.window is not None:
            table.window.length = reused
        unit, hits = reuse_hits(self.policy, reused, n, size)
        return PrefixHit(
            policy=self.policy,
            reused_tokens=reused,
            computed_tokens=n - reused,
            unit=unit,
            hits=hits,
            shared_blocks=shared,
            copied_blocks=copied,
        )

    def _attach_twins(self, segment: list[int], is_whole: bool, window: BlockTable) -> None:
        """The window layers' K/V of one reused segment: its twin shared, or copied into a new window block."""
        size, pool = self.block_size, self.pool.window
        if is_whole:
            pool.block_manager.retain(self.twins[segment[0]])
            window.add(self.twins[segment[0]])
            return
        block = pool.block_manager.allocate()
        window.add(block)
        pool.copy_slots(
            [self.twins[b] * size + i for i, b in enumerate(segment)], [block * size + i for i in range(len(segment))]
        )

    def lookup(self, ids: list[int]) -> list[int]:
        """For each reusable leading token of `ids`, the physical block that holds its K/V (on a model with
        sliding-window layers, only while that block has its twin: see the module's docstring)."""
        blocks = self.index.match(ids)
        if self.pool.window is not None:
            blocks = blocks[: next((p for p, b in enumerate(blocks) if b not in self.twins), len(blocks))]
        return blocks[: reusable_tokens(self.policy, len(blocks), len(ids), self.block_size)]

    def publish(self, ids: list[int], table: BlockTable) -> None:
        """Make a finished generation's prompt K/V findable (its blocks stay put; nothing is copied); a block
        the index now holds keeps its twin in the window layers, where the generation still held it."""
        self._release_twins(self.index.publish(ids, table.blocks))
        window = table.window
        if window is None:
            return
        for logical, block in enumerate(table.blocks[: math.ceil(len(ids) / self.block_size)]):
            if self.index.holds(block) and block not in self.twins and logical >= window.dropped:
                self.twins[block] = window.blocks[logical - window.dropped]
                self.pool.window.block_manager.retain(self.twins[block])

    def take_reclaimed(self) -> list[int]:
        """Blocks reclaimed since the last call."""
        out, self._unreported = self._unreported, []
        return out

    # -- what the cache holds ---------------------------------------------------------------------------

    def holds(self, block: int) -> bool:
        return self.index.holds(block)

    @property
    def cached_blocks(self) -> int:
        return sum(1 for b in range(self.pool.num_blocks) if self.holds(b))

    def cached_free_blocks(self) -> int:
        """Free blocks a lookup can still hit (read under the pool's lock: the pool may be shared)."""
        with self.block_manager.lock:
            return sum(1 for block in self.block_manager.free if self.holds(block))


def reusable_tokens(policy: str, matched: int, prompt_length: int, block_size: int) -> int:
    """At most n−1 tokens (the last is computed to get logits); the block policy in whole blocks."""
    reusable = min(matched, prompt_length - 1)
    return reusable // block_size * block_size if policy == "block" else reusable


def reuse_hits(policy: str, reused: int, prompt_length: int, block_size: int) -> tuple[str, list[bool]]:
    """The unit a policy reuses in ("block" or "token") and, per prompt block or token, whether it was
    reused (hit) or computed (miss). Reuse is a prefix, so the hits come first."""
    if policy == "block":
        return "block", [(k + 1) * block_size <= reused for k in range(math.ceil(prompt_length / block_size))]
    return "token", [p < reused for p in range(prompt_length)]


@dataclass(frozen=True)
class PolicyReuse:
    """What one policy reuses of a prompt: counts and hit or miss per block or token."""

    policy: str
    reused_tokens: int
    computed_tokens: int
    unit: str  # "block" or "token": what `hits` is per
    hits: list[bool]


HISTORY_LIMIT = 8  # published prompts a user's history keeps


class PromptHistory:
    """The prompts one user published, oldest first (the last `limit`): what a new prompt is aligned
    with, and what the policy comparison replays."""

    def __init__(self, limit: int = HISTORY_LIMIT):
        self.limit = limit
        self.prompts: list[list[int]] = []

    def add(self, ids: list[int]) -> None:
        self.prompts = (self.prompts + [list(ids)])[-self.limit :]

    def closest(self, ids: list[int]) -> tuple[list[int], int] | None:
        """The prompt sharing the longest prefix with `ids` (the newest on a tie) and that prefix's
        length, i.e. the first position where they differ; None when nothing was published."""
        best = None
        for prompt in reversed(self.prompts):
            shared = common_prefix_length(prompt, ids)
            if best is None or shared > best[1]:
                best = (prompt, shared)
        return best

    def predicted_reuse(self, ids: list[int], block_size: int) -> dict[str, PolicyReuse]:
        """What each policy would reuse for `ids` after these prompts were published (no eviction).

        The same indexes as `PrefixCache`, run over token ids alone, to compare the policies side by side.
        """
        out = {}
        for policy in REUSE_POLICIES:
            blocks = sum(math.ceil(len(p) / block_size) for p in self.prompts)
            index = new_index(policy, BlockManager(max(blocks, 1), block_size))
            next_block = 0
            for earlier in self.prompts:
                blocks = list(range(next_block, next_block + math.ceil(len(earlier) / block_size)))
                next_block += len(blocks)
                index.publish(earlier, blocks)
            reused = reusable_tokens(policy, len(index.match(ids)), len(ids), block_size)
            out[policy] = PolicyReuse(
                policy, reused, len(ids) - reused, *reuse_hits(policy, reused, len(ids), block_size)
            )
        return out
