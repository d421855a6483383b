"""Continuous batching's scheduler: which requests one step of a server runs, over one pool of KV blocks that
requests share by hash, decided as nano-vllm decides it (its `engine/scheduler.py` and `engine/block_manager.py`;
bench/nanovllm_peer.py compares every decision with them). Plain Python: no tensors, no model.

- Requests wait in arrival order; running ones stay in the order they were admitted.
- A step prefills when it can: waiting requests in order, at most `max_num_seqs` of them and
  `max_num_batched_tokens` tokens in all; only the first may take part of its prompt (a chunked prefill, the rest
  on the next steps); a request whose blocks the pool cannot give waits, and so does every one behind it. The
  leading full blocks of a request's tokens that the pool already holds (found by chained hash, their tokens
  compared) are reused, not computed; the last block is always computed.
- A step that prefills nothing decodes one token for each running request, in order, up to `max_num_seqs`. When
  the pool has no block for a request's next token, the most recently admitted running request is preempted: its
  blocks are freed and it goes back to the head of the waiting queue, to be computed again (prompt and answer so
  far) when it is admitted again.
- After the step's forward pass (`finish_step`), the blocks it filled are hashed so later requests can reuse
  them; a request that has now read its whole prompt, or decoded, gets its token; one that made EOS (unless it
  ignores EOS) or `max_tokens` tokens finishes and returns its blocks, which stay reusable until handed out again.

The blocks themselves (reference counts, the free list, the hashes) are the `BlockManager`'s (engine.blocks), the
one the served pool has; the scheduler decides which of its requests take, share and give back which.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.blocks import BlockManager, block_hash
from engine.checks import require_integer
from engine.errors import InvalidSettingError
from engine.stopping import stop_reason

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
NO_PARENT = b""  # the chained hash before a request's first block


@dataclass(eq=False)
class Request:
    """One request's tokens (its prompt, then what it generated) and where the pool holds their K/V."""

    id: int
    token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False
    prompt_length: int = field(init=False)
    status: str = WAITING
    block_table: list[int] = field(default_factory=list)
    cached: int = 0  # leading tokens whose K/V the pool holds for it (reused or computed)
    scheduled: int = 0  # tokens the current step computes for it

    def __post_init__(self):
        if not self.token_ids:
            raise InvalidSettingError("a request needs at least one prompt token")
        require_integer("max_tokens", self.max_tokens, 1)
        self.token_ids = list(self.token_ids)
        self.prompt_length = len(self.token_ids)

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.prompt_length :]

    def blocks(self, block_size: int) -> int:
        return -(-len(self.token_ids) // block_size)

    def block(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size : (i + 1) * block_size]


@dataclass
class Step:
    """One scheduled step: a prefill (of some waiting requests' tokens) or a decode (one token each), the requests
    with how many tokens each computes and how many it had cached, and the requests preempted to make room."""

    prefill: bool
    requests: list[Request]
    tokens: list[int]
    cached: list[int]
    preempted: list[Request]


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int, eos_ids: set[int]):
        require_integer("max_num_seqs", max_num_seqs, 1)
        require_integer("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.eos_ids = set(eos_ids)
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.waiting: deque[Request] = deque()
        self.running: deque[Request] = deque()

    @property
    def finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, request: Request) -> None:
        if request.blocks(self.block_size) > self.block_manager.num_blocks:
            raise InvalidSettingError(
                f"request {request.id} needs {request.blocks(self.block_size)} blocks; "
                f"the pool has {self.block_manager.num_blocks}"
            )
        self.waiting.append(request)

    def schedule(self) -> Step:
        """The next step (see the module docstring). Raises where nothing can run: the pool cannot hold even the
        first waiting request and none runs."""
        step = self._prefill()
        if step.requests:
            return step
        scheduled, preempted = [], []
        while self.running and len(scheduled) < self.max_num_seqs:
            request = self.running.popleft()
            while not self._can_append(request):
                if self.running:
                    preempted.append(self._preempt(self.running.pop()))
                else:
                    preempted.append(self._preempt(request))
                    break
            else:
                request.scheduled = 1
                if len(request.token_ids) % self.block_size == 1:  # its newest token starts a block
                    request.block_table.append(self.block_manager.allocate())
                scheduled.append(request)
        if not scheduled:
            raise InvalidSettingError("the KV pool cannot hold the next step of any request")
        self.running.extendleft(reversed(scheduled))
        return Step(False, scheduled, [1] * len(scheduled), [r.cached for r in scheduled], preempted)

    def _prefill(self) -> Step:
        scheduled: list[Request] = []
        cached: list[int] = []
        batched = 0
        while self.waiting and len(scheduled) < self.max_num_seqs:
            request = self.waiting[0]
            room = self.max_num_batched_tokens - batched
            if room == 0:
                break
            if not request.block_table:
                reused = self._reusable(request)
                if reused is None:
                    break
                count = len(request.token_ids) - reused * self.block_size
            else:  # the rest of a prompt chunked on an earlier step
                count = len(request.token_ids) - request.cached
            if room < count and scheduled:  # only the first request is chunked
                break
            if not request.block_table:
                self._allocate(request, reused)
            request.scheduled = min(count, room)
            batched += request.scheduled
            if request.cached + request.scheduled == len(request.token_ids):
                request.status = RUNNING
                self.waiting.popleft()
                self.running.append(request)
            scheduled.append(request)
            cached.append(request.cached)
        return Step(True, scheduled, [r.scheduled for r in scheduled], cached, [])

    def _preempt(self, request: Request) -> Request:
        request.status = WAITING
        self._release(request)
        self.waiting.appendleft(request)
        return request

    def finish_step(self, step: Step, token_ids: list[int]) -> list[Request]:
        """After the step's forward pass: `token_ids`, one per request of the step (a chunk that did not end its
        prompt ignores its own). Returns the requests that finished."""
        done = []
        for request, token in zip(step.requests, token_ids, strict=True):
            self._hash_filled(request)
            request.cached += request.scheduled
            request.scheduled = 0
            if step.prefill and request.cached < len(request.token_ids):
                continue
            request.token_ids.append(token)
            if (
                stop_reason(
                    token, self.eos_ids, len(request.generated), request.max_tokens, ignore_eos=request.ignore_eos
                )
                is not None
            ):
                request.status = FINISHED
                self._release(request)
                self.running.remove(request)
                done.append(request)
        return done

    # -- a request's blocks ----------------------------------------------------------------------------

    def _reusable(self, request: Request) -> int | None:
        """How many of the request's leading blocks the pool holds (never its last one), or None when the pool cannot
        give it the blocks it needs besides those."""
        key, reused, needed = NO_PARENT, 0, request.blocks(self.block_size)
        for i in range(request.blocks(self.block_size) - 1):
            key = block_hash(key, request.block(i, self.block_size))
            block = self.block_manager.find(key)
            if block is None:
                break
            reused += 1
            if self.block_manager.ref_count[block]:
                needed -= 1
        return reused if len(self.block_manager.free) >= needed else None

    def _allocate(self, request: Request, reused: int) -> None:
        """The request's blocks: its `reused` leading ones shared, new ones for the rest."""
        key = NO_PARENT
        for i in range(reused):
            key = block_hash(key, request.block(i, self.block_size))
            block = self.block_manager.find(key)
            self.block_manager.retain(block)
            request.block_table.append(block)
        for _ in range(reused, request.blocks(self.block_size)):
            request.block_table.append(self.block_manager.allocate())
        request.cached = reused * self.block_size

    def _release(self, request: Request) -> None:
        for block in reversed(request.block_table):
            self.block_manager.release(block)
        request.cached = 0
        request.block_table.clear()

    def _can_append(self, request: Request) -> bool:
        """Whether the pool has a block for the request's newest token where it starts a block."""
        return len(self.block_manager.free) >= (len(request.token_ids) % self.block_size == 1)

    def _hash_filled(self, request: Request) -> None:
        """Key the blocks the step filled (those it completed), chained from the block before them."""
        start = request.cached // self.block_size
        end = (request.cached + request.scheduled) // self.block_size
        if start == end:
            return
        key = self.block_manager.hash_of[request.block_table[start - 1]] if start > 0 else NO_PARENT
        for i in range(start, end):
            key = block_hash(key, request.block(i, self.block_size))
            self.block_manager.set_hash(request.block_table[i], key)
