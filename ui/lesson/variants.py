"""Which of a chapter's variants (ui/lesson/lesson.toml) hold on a run: each chapter whose text holds only on some
runs names, from the run's facts (`ui.lesson.chapter_facts.facts`), the variants to use, first the one to use. A
variant's parts replace the chapter's own (`ui.lesson.chapters.Chapter.part`), its choices too: so the class's vote
knows which choice is right on the run shown."""

from __future__ import annotations

from ui.lesson import eviction_facts, speculative_facts
from ui.lesson.chapters import Chapter


def variants(chapter: Chapter, numbers: dict) -> list[str]:
    """The chapter's variants (ui/lesson/lesson.toml) whose sentences hold on this run, first the one to use."""
    choose = VARIANTS.get(chapter.key)
    return [name for name in (choose(numbers) if choose else ()) if name]


def _prefix_case1(f: dict) -> tuple[str | None, ...]:
    """Case 1's question: why block reuses less (when it does), why all three agree (when each reuses the whole
    cached prompt), or else a comparison that holds whatever the counts."""
    if "radix" not in f:
        return ()
    if f["block"] < f["radix"]:
        return ()
    return ("all_agree" if f["whole"] == f["radix"] == f["block"] == f["cached_n"] else "compare",)


def _context_window(f: dict) -> tuple[str | None, ...]:
    """The growth chapter: its chart bends at a sliding window; its answer's "halves" and "about a quarter" only
    where the truncation slider's first position (the last half kept) shows them."""
    halving = (
        "one_token"
        if f["n"] < 2
        else "past_window"
        if f["prompt_past_window"]
        else None
        if 40 <= f["kv_keep_pct"] <= 60 and 20 <= f["work_keep_pct"] <= 35
        else "rough"
    )
    return ("windowed" if f["window"] else None, halving)


# chapter key → the variants its run calls for (from `facts`)
VARIANTS = {
    "prefill": lambda f: ("one_token" if f["n"] == 1 else None,),
    "residual": lambda f: ("post_norms" if f["norms"] == 4 else None,),
    "gqa": lambda f: ("mha" if f["group"] == 1 else None,),
    "contexts": lambda f: ("learned" if not f.get("ctx_rope", True) else None,),
    "long_context": lambda f: (None if f.get("kv_doubles", True) else "window_doubling",),
    "prefix_case1": _prefix_case1,
    "context_window": _context_window,
    # its own text once the local layers handed a block back; before that, a variant that holds on either side of W
    "sliding_window": lambda f: ("no_window" if not f["window"] else None if f.get("local_from") else "inside_window",),
    "evicting": eviction_facts.variants,
    "speculative": speculative_facts.variants,
}
