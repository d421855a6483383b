"""Many requests served from one paged KV pool (continuous batching): each step, the scheduler (`engine.scheduler`,
nano-vllm's decisions) picks the requests, and one forward pass runs them all, each request's rows attending only
over its own block table in the shared pool: prompt chunks in a prefill step, one token each in a decode step.
Full prefix blocks computed for one request are read by the next that shares them (chained hashes, reference
counts). Greedy decoding: each request's tokens are those of the request run alone.

    server = Server(model, num_blocks=64, block_size=16, max_num_seqs=8, max_num_batched_tokens=512)
    server.add(prompt_ids, max_tokens=32)        # at any step; returns the request
    while not server.finished:
        report = server.step()                   # plain data: the step's batch, every request's state and blocks

The pool's block manager (engine.blocks) owns its blocks and the scheduler decides who takes which; the pool stores
their K/V. Sliding-window layers (Gemma 3's local ones) keep every position in their own pool under the same block ids
and read only their window, so no block is handed back while a request runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.checks import is_integer
from engine.errors import InvalidSettingError
from engine.kv_cache import BlockTable
from engine.model import Model
from engine.passes import Pass
from engine.scheduler import Request, Scheduler, Step
from engine.trace import NO_RECORD


@dataclass(frozen=True)
class RequestState:
    """One request as a step left it."""

    id: int
    status: str  # waiting, running or finished
    prompt_length: int
    generated: tuple[int, ...]
    cached: int  # tokens whose K/V the pool holds for it
    blocks: tuple[int, ...]  # its block table


@dataclass(frozen=True)
class StepReport:
    """What one step did: its kind, who it ran with how many tokens (and how many each had cached), who it
    preempted, the tokens it produced (request id → token), and every request's state and each used block's owners."""

    index: int
    prefill: bool
    ran: tuple[tuple[int, int, int], ...]  # (request id, tokens computed, tokens cached before)
    preempted: tuple[int, ...]
    produced: dict[int, int]
    requests: tuple[RequestState, ...]
    owners: dict[int, tuple[int, ...]]  # block → the requests whose tables hold it


class Server:
    def __init__(
        self,
        model: Model,
        num_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 512,
    ):
        self.model = model
        self.pool = model.new_pool(num_blocks, block_size)
        self.scheduler = Scheduler(self.pool.block_manager, max_num_seqs, max_num_batched_tokens, model.eos_ids)
        self.requests: list[Request] = []
        self.steps = 0
        self.logits: dict[int, torch.Tensor] = {}  # the latest step's: request id → the logits of its token

    @property
    def finished(self) -> bool:
        return self.scheduler.finished

    def add(self, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> Request:
        """A request, waiting from the next step; `ignore_eos`: it makes `max_tokens` tokens whatever they are."""
        request = Request(len(self.requests), prompt_ids, max_tokens, ignore_eos)  # checks the prompt and max_tokens
        info = self.model.info
        if any(not is_integer(i) or not 0 <= i < info.vocab for i in request.token_ids):
            raise InvalidSettingError(f"prompt ids must be integers from 0 to {info.vocab - 1}")
        if len(request.token_ids) + max_tokens > info.context_limit:
            raise InvalidSettingError(
                f"{info.name} reads at most {info.context_limit} positions; this request needs "
                f"{len(request.token_ids) + max_tokens}"
            )
        self.scheduler.add(request)
        self.requests.append(request)
        return request

    def step(self) -> StepReport:
        """Schedule a step, run it in one forward pass, and hand each request its greedy token."""
        if self.finished:
            raise InvalidSettingError("no request is waiting or running")
        step = self.scheduler.schedule()
        ran = tuple(zip((r.id for r in step.requests), step.tokens, step.cached))
        records = self.model.forward_batch([self._pass(r) for r in step.requests])
        tokens = [int(record.logits.argmax()) for record in records]
        made = [not step.prefill or r.cached + r.scheduled == len(r.token_ids) for r in step.requests]
        produced = {r.id: t for r, t, m in zip(step.requests, tokens, made) if m}
        self.logits = {r.id: record.logits for r, record, m in zip(step.requests, records, made) if m}
        self.scheduler.finish_step(step, tokens)
        self.steps += 1
        return self._report(step, ran, produced)

    def _pass(self, request: Request) -> Pass:
        start, end = request.cached, request.cached + request.scheduled
        table = BlockTable(self.pool, list(request.block_table), end)  # the scheduler took every block it needs
        if table.window is not None:
            table.window = BlockTable(self.pool.window, list(request.block_table), end)
        return Pass(request.token_ids[start:end], list(range(start, end)), table, NO_RECORD)

    def _report(self, step: Step, ran, produced: dict[int, int]) -> StepReport:
        owners: dict[int, list[int]] = {}
        for request in self.requests:
            for block in request.block_table:
                owners.setdefault(block, []).append(request.id)
        states = tuple(
            RequestState(r.id, r.status, r.prompt_length, tuple(r.generated), r.cached, tuple(r.block_table))
            for r in self.requests
        )
        return StepReport(
            self.steps,
            step.prefill,
            ran,
            tuple(r.id for r in step.preempted),
            produced,
            states,
            {block: tuple(ids) for block, ids in owners.items()},
        )
