"""The speculative chapter ("Several tokens per pass"): its numbers, read from the run the speculative view draws
(`ui.runs.speculative`) at the page's step (a verify pass)."""

from __future__ import annotations

from engine.errors import KvscopeError
from ui.views.context import ViewContext
from viz.speculative import totals


def facts(ctx: ViewContext) -> dict:
    """The chapter's numbers after the page's pass; {} where the settings cannot run (the view says why)."""
    try:
        run = ctx.speculative()
    except KvscopeError:
        return {}
    step = min(ctx.step, len(run.passes))
    out = dict(
        sp_k=run.setup.k,
        sp_draft=ctx.t(f"fig_spec_draft_{run.setup.draft}"),
        sp_step=step,
        sp_rows_most=run.setup.k + 1,
        sp_greedy=run.setup.sampling.greedy,
    )
    if not step:
        return out
    done, sums = run.passes[step - 1], totals(run.passes[:step], ctx.info)
    if not done.guesses:
        verdict = ctx.t("lesson_spec_no_guess")
    elif done.accepted == len(done.guesses):
        verdict = ctx.t("lesson_spec_all_kept", n=done.accepted)
    else:
        verdict = ctx.t(
            "lesson_spec_miss",
            n=done.accepted,
            guesses=len(done.guesses),
            at=done.accepted + 1,
            guess=ctx.token_text(done.guesses[done.accepted]),
            token=ctx.token_text(done.token_id),
        )
    out.update(
        sp_rows=done.rows_written,
        sp_verdict=verdict,
        sp_added=ctx.t("count_tokens", n=len(done.added)),
        sp_discarded=done.rows_discarded,
        sp_tokens=sums.tokens,
        sp_passes=sums.passes,
        sp_per_pass=sums.tokens_per_pass,
        sp_decode_passes=sums.decode_passes,
        sp_mib=sums.bytes_per_token / 2**20,
        sp_plain_mib=sums.plain_bytes_per_token / 2**20,
    )
    return out


def variants(facts: dict) -> tuple[str | None, ...]:
    """The claim that holds: before any pass after the prefill there are no bytes a token to quote; sampling keeps
    the model's distribution, not its greedy answer."""
    if not facts.get("sp_decode_passes"):
        return ("prefill_only",)
    return (None if facts.get("sp_greedy", True) else "sampled",)
