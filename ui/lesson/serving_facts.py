"""The serving chapter ("Many requests, one cache"): its numbers, read from the served class the Serving view draws
(`ui.runs.serving`) at the page's step."""

from __future__ import annotations

from engine.errors import InvalidSettingError
from ui.views.context import ViewContext
from viz.serving import request_names


def facts(ctx: ViewContext) -> dict:
    """The chapter's numbers at the page's step; {} where the settings cannot serve (the view says why)."""
    try:
        served = ctx.served_class()
    except InvalidSettingError:
        return {}
    setup, info = served.setup, ctx.info
    step = min(ctx.step, len(served.steps))
    report = served.steps[step - 1].report if step else None
    out = dict(
        sv_total=len(setup.prompts),
        sv_blocks=setup.num_blocks,
        sv_block_size=setup.block_size,
        sv_step=step,
        sv_used=len(report.owners) if report else 0,
        sv_holders=sum(1 for s in report.requests if s.blocks) if report else 0,
    )
    ran = [rid for rid, _, _ in report.ran] if report else []
    if report is None:
        out["sv_did"] = ctx.t("lesson_serve_not_yet")
    elif report.prefill:
        out["sv_did"] = ctx.t(
            "lesson_serve_prefilled",
            n=len(report.ran),
            requests=request_names(ran),
            computed=sum(t for _, t, _ in report.ran),
            reused=sum(c for _, _, c in report.ran),
        )
    else:
        out["sv_did"] = ctx.t("lesson_serve_decoded", n=len(report.ran), requests=request_names(ran))
    shared = {block: held for block, held in report.owners.items() if len(held) > 1} if report else {}
    if shared:
        most = max(len(held) for held in shared.values())
        stored_again = sum(len(held) - 1 for held in shared.values()) * setup.block_size * info.kv_bytes_per_token
        out["sv_shared_note"] = ctx.t("lesson_serve_shared", n=len(shared), most=most, saved_kib=stored_again / 1024)
    else:
        out["sv_shared_note"] = ctx.t("lesson_serve_none_shared")
    preempted = [(s.report.index, s.report.preempted) for s in served.steps[:step] if s.report.preempted]
    if preempted:
        first, who = preempted[0]
        out["sv_preempt_note"] = ctx.t(
            "lesson_serve_preempted",
            step=step,
            n=sum(len(w) for _, w in preempted),
            first=first,
            requests=request_names(who),
        )
    else:
        out["sv_preempt_note"] = ctx.t("lesson_serve_no_preemption", step=step, blocks=setup.num_blocks)
    return out
