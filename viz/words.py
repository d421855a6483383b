"""The words `viz` draws into figures and tables, in English: every viz function takes a `words` mapping
with these keys, so a page in another language passes its own (ui.strings holds the translations).
Some entries are format strings; the function that uses one fills it with `str.format`.
"""

from __future__ import annotations

from collections.abc import Mapping

Words = Mapping[str, str]

ENGLISH: dict[str, str] = {
    # attention
    "query": "query", "key": "key",
    "query_axis": "query (row = one step's token)", "key_axis": "key (cached position)",
    # candidates
    "cand_drawn": "drawn", "cand_token": "token", "cand_id": "id",
    "cand_p_raw": "softmax", "cand_p_temperature": "÷ temperature", "cand_p_top_k": "after top-k",
    "cand_p_top_p": "after top-p",
    "stage_p_raw": "softmax(logits)", "stage_p_temperature": "÷ temperature", "stage_p_top_k": "top-k",
    "stage_p_top_p": "top-p → drawn from", "probability": "probability",
    # costs
    "step": "step", "phase": "phase", "tokens_in": "tokens in", "cached_positions": "cached positions",
    "kv_bytes_read": "K/V bytes read", "forward_ms": "forward", "total_ms": "total",
    "phase_prefill": "prefill", "phase_decode": "decode",
    "step_hover": "step %{x} (%{customdata[0]}, %{customdata[1]} tokens): %{y:,.1f} ms",
    "ms": "ms", "ms_per_token": "ms per token", "decode_step": "decode step", "mib_per_step": "MiB read per step",
    "kv_read_hover": "step %{{x}}: %{{y:,.2f}} MiB of K/V read in {layers} layers",
    "prefill_per_token": "prefill ({n} tokens at once), per token",
    "decode_per_token": "decode, one token per step (median of {n} steps)",
    "memory_floor": "decode floor: bytes read ÷ memory bandwidth",
    "tokens": "tokens", "millions": "millions", "growth_kv": "KV cache (MiB): linear",
    "growth_scores": "prefill scores (millions): quadratic", "context_limit": "context limit {limit}",
    # one step, end to end
    "layer": "layer", "residual_x0": "x0 (layer input)", "residual_x1": "x1 = x0 + attention",
    "residual_x2": "x2 = x1 + FFN", "norm_axis": "|x| (length of the vector)", "dim": "dim",
    "dimension": "dimension",
    # paged KV cache
    "bt_logical": "logical block", "bt_physical": "physical block", "bt_positions": "positions",
    "bt_filled": "filled", "bt_tokens": "tokens",
    "block_slot_hover": "block %{y}, slot %{x}", "slot_axis": "slot (offset in block)",
    "physical_block": "physical block", "in_use": "in use", "cached_free": "cached, free", "empty": "empty",
    "blocks": "blocks", "dtype": "dtype", "layout": "layout", "formula": "formula",
    "bytes_per_token": "bytes per token", "bytes_for": "bytes for {n} tokens",
    "layout_gqa": "GQA (as loaded)", "layout_mha": "MHA (one K/V per Q head)",
    # prefix cache
    "align_position": "position", "align_cached_token": "cached token", "align_cached_id": "cached id",
    "align_new_id": "new id", "align_new_token": "new token", "align_same_id": "same id", "align_reused": "reused",
    "hit": "hit", "miss": "miss", "pos": "positions", "pos_axis": "prompt position",
    "pol_policy": "policy", "pol_reused_tokens": "reused tokens", "pol_computed_tokens": "computed tokens",
    "pol_prefill_saved": "prefill saved",
    "policy_block": "block hash (vLLM)", "policy_radix": "radix tree (SGLang)", "policy_whole": "whole prompt (article)",
    # split-KV
    "split": "split", "keys": "keys", "count": "count", "scores": "scores", "m_i": "m_i (max score)",
    "weight": "weight w_i/Σw", "o_i": "O_i (partial output)", "empty_split": "(empty)",
    "merged": "merged", "unsplit": "unsplit", "merge_diff": "|merged − unsplit|",
    "partial_name": "O_{i} (keys {start}–{end}, w={w})", "merged_name": "merged = Σ w_i O_i / Σ w_i",
}
