"""The numbers a chapter's placeholders name (`{layers}`, `{kv_kib}`, …): the loaded model's and this step's own, so
that the lesson quotes the run on screen, and the facts `variants` reads to choose the sentences that hold; with the
chapter the page shows (`current`), whose figure decides which view's facts join them."""

from __future__ import annotations

from engine.kv_cache import kv_bytes_per_token
from engine.reference_models import reference_info
from engine.split_kv import worked_example
from engine.timing import crossover_batch, crossover_context, decode_step_bytes, weight_bytes_read
from ui.lesson import eviction_facts, serving_facts, speculative_facts
from ui.lesson.chapters import CHAPTERS, Chapter
from ui.text.strings import Shown
from ui.views.context import ViewContext
from ui.views.contexts_shown import contexts_facts
from ui.views.widgets import shown_layer_head
from viz.costs import attention_scores, context_growth_frame, growth_lengths
from viz.kv_cache import difference_text
from viz.split_kv import vector_text
from viz.style import fmt_size
from viz.tokens import position_label


def facts(ctx: ViewContext) -> dict:
    """The loaded model's and this step's own numbers, by the names the chapters' placeholders use, and the facts
    `variants` reads to choose the sentences that hold on this run."""
    info, trace, runner = ctx.info, ctx.trace, ctx.runner
    n = len(runner.prompt_ids)
    out = dict(
        name=info.name,
        layers=info.layers,
        adds=2 * info.layers,
        hidden=info.hidden,
        vocab=info.vocab,
        q_heads=info.q_heads,
        kv_heads=info.kv_heads,
        group=info.gqa_group,
        head_dim=info.head_dim,
        concat=info.q_heads * info.head_dim,
        kv_bytes=info.kv_bytes_per_token,
        dtype=info.dtype,
        mha_bytes=kv_bytes_per_token(info.layers, info.q_heads, info.head_dim, info.element_bytes),
        element=info.element_bytes,
        limit=info.context_limit,
        n=n,
        n_tokens=ctx.t("count_tokens", n=n),
        n_but_one=n - 1,
        step=ctx.step,
        block_size=ctx.state.block_size,
        norms=len(info.layer_norms),
        positions_note=ctx.t("lesson_positions_learned" if info.positions == "learned" else "lesson_positions_rope"),
        embed_note=embed_note(ctx),
        policy=ctx.t("policy_" + ctx.state.policy),
        kv_half_heads=info.kv_heads // 2,
        kv_half_bytes=info.kv_bytes_per_token // 2,
    )
    out.update(model_window_facts(info))
    out.update(growth_facts(ctx, n))
    if trace is not None:
        context = trace.context_length
        out.update(
            id=trace.token_id,
            token=ctx.cells[-1].text,
            inputs=len(trace.input_ids),
            context=context,
            position=trace.positions[-1],
            blocks=len(trace.block_table),
            kv_kib=info.kv_bytes(context) / 1024,
            read_mib=info.kv_bytes(context) / 2**20,
            read_double_mib=info.kv_bytes(2 * context) / 2**20,
            kv_doubles=info.kv_bytes(2 * context) == 2 * info.kv_bytes(context),
            past_window=info.sliding_window is not None and context > info.sliding_window,
            split_note=split_note(ctx),
        )
        out.update(
            {
                key: ctx.t("lesson_window_" + key.split("_")[1], local=out["local"], window=out["window"])
                if out["past_window"]
                else ""
                for key in ("window_clause", "window_reads")
            }
        )
        out.update(cost_facts(info, context))
        out.update(
            alone_note=ctx.t(
                "lesson_alone_beyond" if out["cross_context"] > info.context_limit else "lesson_alone_within",
                cross_context=out["cross_context"],
                limit=info.context_limit,
                context=context,
            )
        )
        out.update(window_facts(ctx, context))
        if ctx.state.pool == "busy":
            out.update(busy_facts(runner.busy_pool(ctx.step)))
        if trace.split is not None:
            out.update(split_facts(ctx))
        # The eviction chapter's, its figures'.
        out.update(eviction_facts.facts(ctx) if ctx.state.view == "eviction" else {})
        out.update(contexts_facts(ctx) if (chapter := current(ctx)) and chapter.figure == "contexts" else {})
        if ctx.state.view == "attention" and trace.attention is not None:
            out.update(attention_facts(ctx, context))
        out.update(inputs_tokens=ctx.t("count_tokens", n=len(trace.input_ids)))
    out.update(serving_facts.facts(ctx) if ctx.state.view == "serving" else {})  # its step is the server's
    out.update(speculative_facts.facts(ctx) if ctx.state.view == "speculate" else {})  # its step is a verify pass
    hit = runner.prefix_hit()
    if hit is not None:
        out.update(
            reused=hit.reused_tokens,
            computed=hit.computed_tokens,
            reuse_note=ctx.t("lesson_reuse_note", reused=hit.reused_tokens, computed=hit.computed_tokens)
            if hit.reused_tokens
            else "",
        )
    closest = runner.closest_cached()
    if closest is not None and hit is not None:
        out.update(prefix_facts(ctx, closest, hit))
    return out


def embed_note(ctx: ViewContext) -> str:
    """Where the model scales the embedding row it looks up (Gemma: by √hidden), the words that say so."""
    scale = ctx.runner.embed_scale
    return ctx.t("lesson_embed_scaled", hidden=ctx.info.hidden, scale=float(scale)) if scale is not None else ""


def split_note(ctx: ViewContext) -> str:
    """A token of this run that is not one whole character: a character split over several tokens, or else a
    token holding several characters (a special token of the template aside)."""
    cells = [c for c in reversed(ctx.cells) if c.kind != "prompt"] + [c for c in ctx.cells if c.kind == "prompt"]
    for cell in cells:  # the answer's first, the newest first
        if cell.group.size > 1 and cell.group.whole:
            return ctx.t("lesson_split_character", text=cell.group.text, count=cell.group.size)
    for cell in cells:
        text = cell.text.strip()
        if cell.group.whole and len(text) > 1 and not (text.startswith("<") and text.endswith(">")):
            return ctx.t("lesson_split_token", text=text, count=len(text))
    return ""


def model_window_facts(info) -> dict:
    """The model's sliding window: its size and its local and global layers (a model without one: 0 local)."""
    kinds = info.layer_kinds
    return dict(
        window=info.sliding_window or 0,
        local=kinds.count("local"),
        global_=kinds.count("global"),
        global_bytes=(info.kv_bytes(info.sliding_window + 1) - info.kv_bytes(info.sliding_window))
        if info.sliding_window
        else info.kv_bytes_per_token,
    )


def growth_facts(ctx: ViewContext, n: int) -> dict:
    """The context chapter: the growth chart's own numbers (its K/V and scores at the window and at the limit,
    `viz.costs.context_growth_frame` at its lengths), what every layer global would take at the limit, and what
    the truncation slider under the chart shows at its first position (the prompt's last half kept)."""
    info = ctx.info
    frame = context_growth_frame(info, growth_lengths(info)).set_index("tokens")
    limit, window = info.context_limit, info.sliding_window
    keep = max(1, n // 2)
    out = dict(
        kv_limit_mib=frame.loc[limit, "KV cache MiB"],
        scores_limit=frame.loc[limit, "attention scores (millions)"],
        all_limit_mib=limit * info.kv_bytes_per_token / 2**20,
        all_scores_limit=info.layers * info.q_heads * limit * (limit + 1) / 2 / 1e6,
        keep=keep,
        keep_tokens=ctx.t("count_tokens", n=keep),
        kv_n_kib=info.kv_bytes(n) / 1024,
        kv_keep_kib=info.kv_bytes(keep) / 1024,
        kv_keep_pct=100 * info.kv_bytes(keep) / info.kv_bytes(n),
        work_keep_pct=100 * attention_scores(info, keep) / attention_scores(info, n),
        prompt_past_window=window is not None and n > window,
    )
    if window is not None and window in frame.index:
        out.update(kv_window_mib=frame.loc[window, "KV cache MiB"])
    return out


def attention_facts(ctx: ViewContext, context: int) -> dict:
    """The attention chapters: the divisor of the shown layer's scores (1/√head_dim for most models; Gemma's
    query_pre_attn_scalar may differ), and whether that layer's window has begun to slide."""
    layer, _ = shown_layer_head(ctx)
    scale = ctx.runner.attention_scale(layer)
    square = 1 / scale**2
    divisor = f"/√{round(square):,}" if abs(square - round(square)) < 1e-3 * square else f" × {scale:.4g}"
    window = ctx.info.window(layer)
    return dict(
        score_divisor=Shown(divisor),
        shown_layer=layer,
        layer_window_note=ctx.t("lesson_layer_window", layer=layer, window=window, context=context)
        if window is not None and context > window
        else "",
    )


def prefix_facts(ctx: ViewContext, closest: tuple[list[int], int], hit) -> dict:
    """The prefix-cache chapters: the cached prompt's tokens as this model cuts them, the tokens both prompts
    share, what each policy reuses, and what the alignment table's reused column (this run's policy) shows."""
    cached, first = closest
    runner = ctx.runner
    reuse = {policy: r.reused_tokens for policy, r in runner.policy_reuse().items()}
    cached_labels = [position_label(c) for c in runner.prompt_cells(cached)]
    radix = reuse["radix"]
    size = ctx.state.block_size
    policy = ctx.t("policy_" + hit.policy)
    if hit.reused_tokens >= radix:
        table_note = ctx.t("lesson_table_all", policy=policy, reused=hit.reused_tokens)
    else:  # the block policy (whole blocks only) or the whole-prompt rule (a whole cached prompt only)
        table_note = ctx.t(
            "lesson_table_less_" + ("block" if hit.policy == "block" else "whole"),
            policy=policy,
            reused=hit.reused_tokens,
            radix=radix,
            size=size,
            full_blocks=radix // size,
            full=radix // size * size,
        )
    extends = (
        ctx.t("lesson_case1_extends", cached_n=len(cached))
        if radix >= len(cached)
        else ctx.t("lesson_case1_joint", radix=radix)
    )  # the tokenizer may cut the joint of the two texts differently
    return dict(
        cached_n=len(cached),
        first=first,
        **reuse,
        extends_note=extends,
        cached_tokens=" · ".join(cached_labels),
        shared_tokens=" · ".join(ctx.labels[:first]),
        partial=radix - radix // size * size,
        full_blocks=radix // size,
        table_note=table_note,
    )


def cost_facts(info, context: int) -> dict:
    """What one decode step reads at `context` positions, for this model and Qwen3-0.6B (the long-context chapter):
    the weights, and the batch (or context) from which the K/V passes them."""
    qwen = reference_info("Qwen3-0.6B")
    batch = crossover_batch(info, context)
    return dict(
        weights_mib=weight_bytes_read(info) / 2**20,
        cross_batch=batch,
        cross_batch_mib=decode_step_bytes(info, context, batch) / 2**20,
        cross_batch_double=crossover_batch(info, 2 * context),
        cross_context=crossover_context(info, 1),
        limit_batch=crossover_batch(info, info.context_limit),
        qwen_weights_mib=weight_bytes_read(qwen) / 2**20,
        qwen_kv_kib=qwen.kv_bytes_per_token / 1024,
        qwen_cross_context=crossover_context(qwen, 1),
        qwen_cross_batch=crossover_batch(qwen, context),
    )


def window_facts(ctx: ViewContext, context: int) -> dict:
    """The sliding-window chapter, from this step's own tables (`StepTrace.block_table`, and the local layers'
    `window_block_table` from `window_start`): where the newest query's window starts, what the local layers hold and
    handed back to the pool, what the global layers keep, in positions, blocks and bytes; and a model's K/V at its
    limit (every layer global)."""
    info, trace = ctx.info, ctx.trace
    size = ctx.runner.pool_state().block_size
    kinds = info.layer_kinds
    per_layer = kv_bytes_per_token(1, info.kv_heads, info.head_dim, info.element_bytes)  # one position, one layer
    local, start, position = kinds.count("local"), trace.window_start, trace.positions[-1]
    held = context - start
    return dict(
        reads_from=max(0, position - (info.sliding_window or context) + 1),
        local_from=start,
        last=context - 1,
        local_held=held,
        local_blocks=len(trace.window_block_table),
        returned=start // size,
        returned_last=start - 1,
        returned_kib=start * local * per_layer / 1024,
        global_blocks=len(trace.block_table),
        local_kib=held * local * per_layer / 1024,
        global_kib=context * (info.layers - local) * per_layer / 1024,
        all_kib=context * info.kv_bytes_per_token / 1024,
        global_layers=Shown(", ".join(str(i) for i, kind in enumerate(kinds) if kind == "global")),
        limit_all=Shown(fmt_size(info.context_limit * info.kv_bytes_per_token)),
    )


def busy_facts(picture) -> dict:
    """This run replayed in a pool other requests used first (the paging chapter): where its first blocks landed."""
    table = picture.block_table
    shown = ", ".join(f"{logical} → {physical}" for logical, physical in enumerate(table[:4]))
    return dict(
        busy_map=Shown(shown + (", …" if len(table) > 4 else "")),
        busy_diff=Shown(difference_text(picture.kv_max_diff)),
        busy_others=picture.requests_before,
        busy_finished=len(picture.freed),
    )


def split_facts(ctx: ViewContext) -> dict:
    """Split-KV as the split view beside the chapter shows it (its layer and head, its difference), the largest
    difference over all layers and heads with where it is, and the view's worked example (our own inputs)."""
    split = ctx.trace.split
    layer, head = shown_layer_head(ctx)
    diffs = split.max_abs_diff
    top_layer, top_head = divmod(int(diffs.argmax()), diffs.shape[1])
    sizes = dict(layers=diffs.shape[0], heads=diffs.shape[1])
    note = (
        ctx.t("lesson_split_max_here", **sizes)
        if (top_layer, top_head) == (layer, head)
        else ctx.t("lesson_split_max_elsewhere", **sizes, diff=diffs.max().item(), layer=top_layer, head=top_head)
    )
    example = worked_example()
    return dict(
        splits=len(split.ranges),
        layer=layer,
        head=head,
        diff=diffs[layer, head].item(),
        diff_all_note=note,
        example_merged=Shown(vector_text(example.merged, 3)),
        example_unsplit=Shown(vector_text(example.unsplit, 3)),
    )


def current(ctx: ViewContext) -> Chapter | None:
    number = ctx.state.chapter
    return CHAPTERS[number - 1] if number else None
