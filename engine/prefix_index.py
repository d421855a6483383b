"""The prefix cache's three reuse policies, each an index over a block manager's blocks (engine.prefix_cache says
what each reuses and why): the block hash (vLLM), the whole prompt (the source article), the radix tree (SGLang).
An index finds the blocks holding the K/V of a prompt's leading tokens (`match`), takes a published prompt's blocks
(`publish`), says whether it finds a block (`holds`) and forgets one its manager hands out again (`forget`)."""

from __future__ import annotations

import math

from engine.blocks import BlockManager, block_hash


def common_prefix_length(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class BlockHashIndex:
    """vLLM: full blocks only, found by their chained hashes, which the block manager keeps."""

    def __init__(self, block_manager: BlockManager):
        self.block_size = block_manager.block_size
        self.block_manager = block_manager

    def hashes(self, ids: list[int]) -> list[bytes]:
        """The chained key of each full block of `ids`."""
        keys, parent, size = [], b"", self.block_size
        for start in range(0, len(ids) - size + 1, size):
            parent = block_hash(parent, ids[start : start + size])
            keys.append(parent)
        return keys

    def match(self, ids: list[int]) -> list[int]:
        blocks: list[int] = []
        for key in self.hashes(ids):
            block = self.block_manager.find(key)
            if block is None:
                break  # the chain is broken: later blocks cannot be reused even if equal
            blocks.extend([block] * self.block_size)
        return blocks

    def publish(self, ids: list[int], table_blocks: list[int]) -> set[int]:
        """Key each full block of `ids`; returns the blocks whose keys now name a later block (they are no longer
        found)."""
        return {
            before
            for key, block in zip(self.hashes(ids), table_blocks)
            if (before := self.block_manager.set_hash(block, key)) is not None
        }

    def holds(self, block: int) -> bool:
        return self.block_manager.hashed(block)

    def forget(self, block: int) -> set[int]:
        self.block_manager.unhash(block)
        return {block}  # later blocks of the chain stay: a lookup stops at the gap, and they wait to be reclaimed


class WholePromptIndex:
    """The source article's rule: an entry is a whole earlier prompt."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.entries: dict[tuple[int, ...], list[int]] = {}
        self.by_block: dict[int, set[tuple[int, ...]]] = {}

    def match(self, ids: list[int]) -> list[int]:
        for length in sorted({len(key) for key in self.entries if len(key) <= len(ids)}, reverse=True):
            blocks = self.entries.get(tuple(ids[:length]))
            if blocks is not None:
                return [blocks[p // self.block_size] for p in range(length)]
        return []

    def publish(self, ids: list[int], table_blocks: list[int]) -> set[int]:
        key = tuple(ids)
        if key not in self.entries:
            blocks = table_blocks[: math.ceil(len(ids) / self.block_size)]
            self.entries[key] = blocks
            for block in blocks:
                self.by_block.setdefault(block, set()).add(key)
        return set()  # an earlier entry stays

    def holds(self, block: int) -> bool:
        return block in self.by_block

    def forget(self, block: int) -> set[int]:
        """Drop every whole prompt stored partly in `block`; return the blocks no prompt holds any more."""
        dropped = {block}
        for key in self.by_block.pop(block, set()):
            for other in self.entries.pop(key):
                users = self.by_block.get(other)
                if users is not None:
                    users.discard(key)
                    if not users:
                        del self.by_block[other]
                        dropped.add(other)
        return dropped


class _Node:
    __slots__ = ("tokens", "blocks", "children", "parent")

    def __init__(self, tokens: list[int], blocks: list[int], parent: _Node | None):
        self.tokens = tokens  # the edge label: token ids
        self.blocks = blocks  # for each of those tokens, the physical block holding its K/V
        self.children: dict[int, _Node] = {}  # by first token
        self.parent = parent


class RadixIndex:
    """SGLang: a radix tree over token ids; reuse is the longest common prefix."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.root = _Node([], [], None)
        self.by_block: dict[int, set[_Node]] = {}

    def match(self, ids: list[int]) -> list[int]:
        node, i, blocks = self.root, 0, []
        while i < len(ids) and ids[i] in node.children:
            child = node.children[ids[i]]
            shared = common_prefix_length(child.tokens, ids[i:])
            blocks.extend(child.blocks[:shared])
            i += shared
            if shared < len(child.tokens):
                break
            node = child
        return blocks

    def publish(self, ids: list[int], table_blocks: list[int]) -> set[int]:
        per_token = [table_blocks[p // self.block_size] for p in range(len(ids))]
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                self._attach(_Node(ids[i:], per_token[i:], node))
                break
            shared = common_prefix_length(child.tokens, ids[i:])
            if shared < len(child.tokens):
                child = self._split(child, shared)
            i += shared
            node = child
        return set()  # a path already in the tree keeps its blocks

    def holds(self, block: int) -> bool:
        return block in self.by_block

    def forget(self, block: int) -> set[int]:
        """Cut every path at its first token stored in `block`; what hangs below goes too. Returns the
        blocks no path holds any more."""
        touched = {block}
        for node in list(self.by_block.get(block, ())):
            if block not in node.blocks:  # already cut while handling another node
                continue
            cut, first = node.blocks.index(block), node.tokens[0]
            touched.update(node.blocks)
            for child in list(node.children.values()):
                touched.update(self._drop(child))
            node.children = {}
            self._unregister(node)
            node.tokens, node.blocks = node.tokens[:cut], node.blocks[:cut]
            if cut == 0:
                del node.parent.children[first]
            else:
                self._register(node)
        return {b for b in touched if b not in self.by_block}

    # -- tree upkeep ---------------------------------------------------------------------------

    def _attach(self, node: _Node) -> None:
        node.parent.children[node.tokens[0]] = node
        self._register(node)

    def _split(self, node: _Node, at: int) -> _Node:
        """Split `node`'s edge after `at` tokens; return the new upper part."""
        upper = _Node(node.tokens[:at], node.blocks[:at], node.parent)
        self._unregister(node)
        node.parent.children[upper.tokens[0]] = upper
        node.tokens, node.blocks, node.parent = node.tokens[at:], node.blocks[at:], upper
        upper.children[node.tokens[0]] = node
        self._register(upper)
        self._register(node)
        return upper

    def _drop(self, node: _Node) -> set[int]:
        """Remove `node` and everything below it; return the blocks they held."""
        held = set(node.blocks)
        for child in list(node.children.values()):
            held |= self._drop(child)
        self._unregister(node)
        node.children = {}
        node.blocks = []
        return held

    def _register(self, node: _Node) -> None:
        for block in set(node.blocks):
            self.by_block.setdefault(block, set()).add(node)

    def _unregister(self, node: _Node) -> None:
        for block in set(node.blocks):
            users = self.by_block.get(block)
            if users is not None:
                users.discard(node)
                if not users:
                    del self.by_block[block]


def new_index(policy: str, block_manager: BlockManager) -> BlockHashIndex | RadixIndex | WholePromptIndex:
    """The index of a reuse policy over a manager's blocks (the block policy's keys are the manager's hashes)."""
    if policy == "block":
        return BlockHashIndex(block_manager)
    return {"radix": RadixIndex, "whole": WholePromptIndex}[policy](block_manager.block_size)
