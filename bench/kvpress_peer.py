"""Our eviction (engine.eviction) against NVIDIA kvpress 0.5.5 on the same weights and prompt. Dev only: kvpress
is not a project dependency (it pins transformers < 5.3), so the peer side runs in its own venv.

    python3 -m venv /tmp/kvpress-venv
    /tmp/kvpress-venv/bin/pip install torch==2.13.0 "transformers<5.3" kvpress==0.5.5
    /tmp/kvpress-venv/bin/python bench/kvpress_peer.py peer --out /tmp/peer.json \
        --model ~/.cache/kvscope/smollm2-135m-instruct-98362432-float32
    HF_HUB_OFFLINE=1 python3 bench/kvpress_peer.py compare --model embedded --peer /tmp/peer.json

`peer` runs each case as kvpress's pipeline does (the context prefilled under the press, then the last prompt
token and greedy steps over the cache; a DecodingPress around those; for `rerotate:` cases a KeyRerotationPress
around the press, the last prompt token then at the position after the kept ones) with eager attention, and
records per (layer, KV head) the positions the cache holds (each cached key row matched bit for bit to the row it
was copied from; a turned key matches none, so there the press's own kept indices, recorded as it turns them),
the logits of every step (the first in full, later ones at their top ids) and the greedy tokens.
`compare` runs the same cases in our engine and prints, per case: kept positions equal, max |Δlogit|, tokens equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = (
    "The KV cache stores one key and one value per token, per layer and per head. When a long document no "
    "longer fits, a server must decide what to forget: the oldest tokens, the ones attention ignores, or the "
    "ones with small keys. Each choice changes what the model writes next. Summarise the trade-off in one"
)
STEPS = 12
TOP_IDS = 50  # later steps' logits are kept at the peer's top ids only (the file stays small)
REROTATE = "rerotate:"  # a case's name prefix: kvpress's KeyRerotationPress around the press

# (name, policy, its parameters, prefill compression ratio, decode budget (target_size, interval) or None)
# pyramidkv's window of 4 lets its pyramid hold at 0.25 and 0.5 (at 0.75 it falls back to one count); lagkv's lag
# of 8 cuts the context into partitions (its default of 128 is a ramp on this prompt: the case after the list)
PRESS_CASES = [
    ("streaming_llm", {"n_sink": 4}),
    ("knorm", {}),
    ("keydiff", {}),
    ("snapkv", {"window_size": 8, "kernel_size": 5}),
    ("tova", {}),
    ("observed_attention", {}),
    ("pyramidkv", {"window_size": 4, "kernel_size": 5}),
    ("adakv", {"window_size": 8, "kernel_size": 5}),
    ("lagkv", {"lag_size": 8}),
    ("expected_attention", {}),
]
ONE_COUNT = [(name, params) for name, params in PRESS_CASES if name not in ("pyramidkv", "adakv")]  # re-rotatable
CASES = (
    [(f"{name}@{ratio}", name, params, ratio, None) for ratio in (0.25, 0.5, 0.75) for name, params in PRESS_CASES]
    + [
        ("snapkv@0.5 w16 k7", "snapkv", {"window_size": 16, "kernel_size": 7}, 0.5, None),
        ("pyramidkv@0.5 w8 beta4", "pyramidkv", {"window_size": 8, "kernel_size": 5, "beta": 4}, 0.5, None),
        ("adakv@0.5 alpha0.5", "adakv", {"window_size": 8, "kernel_size": 5, "alpha_safeguard": 0.5}, 0.5, None),
        ("lagkv@0.5 lag128", "lagkv", {}, 0.5, None),
        ("decode:knorm", "knorm", {}, 0.0, (32, 4)),
        ("decode:keydiff", "keydiff", {}, 0.0, (32, 4)),
        ("decode:tova", "tova", {}, 0.0, (32, 4)),
        ("decode:observed_attention", "observed_attention", {}, 0.0, (32, 4)),
        ("decode:streaming_llm", "streaming_llm", {"n_sink": 4}, 0.0, (32, 3)),
        ("decode:snapkv", "snapkv", {"window_size": 2, "kernel_size": 3}, 0.0, (32, 4)),
        ("decode:lagkv", "lagkv", {"lag_size": 4}, 0.0, (32, 4)),
        ("decode:expected_attention", "expected_attention", {"n_sink": 2}, 0.0, (32, 4)),  # 2 of 4 queries stay
    ]
    + [(f"{REROTATE}{name}@0.5", name, params, 0.5, None) for name, params in ONE_COUNT]
)


def prompt_ids(tokenizer) -> list[int]:
    return tokenizer(PROMPT, add_special_tokens=False)["input_ids"]


# -- the peer, in the kvpress venv ------------------------------------------------------------------


def run_peer(model_dir: str, out: str, only: list[str]) -> None:
    import torch
    from kvpress import (
        AdaKVPress,
        DecodingPress,
        ExpectedAttentionPress,
        KeyDiffPress,
        KeyRerotationPress,
        KnormPress,
        LagKVPress,
        ObservedAttentionPress,
        PyramidKVPress,
        SnapKVPress,
        StreamingLLMPress,
        TOVAPress,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    def ada_snapkv(compression_ratio=0.0, alpha_safeguard=0.2, **params):  # AdaKV around SnapKV (Ada-SnapKV)
        return AdaKVPress(SnapKVPress(compression_ratio=compression_ratio, **params), alpha_safeguard=alpha_safeguard)

    presses = {
        "streaming_llm": StreamingLLMPress,
        "knorm": KnormPress,
        "keydiff": KeyDiffPress,
        "snapkv": SnapKVPress,
        "tova": TOVAPress,
        "observed_attention": ObservedAttentionPress,
        "pyramidkv": PyramidKVPress,
        "adakv": ada_snapkv,
        "lagkv": LagKVPress,
        "expected_attention": ExpectedAttentionPress,
    }
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    # AdaKV masks keys inside kvpress's patched attention functions, which refuse eager attention; PyramidKV leaves
    # layers of different lengths, which eager attention's one mask (from the first layer's length) cannot cover
    sdpa = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = prompt_ids(tokenizer)
    n = len(ids) - 1
    context = torch.tensor([ids[:-1]])

    def prefill_keys(model):  # every position's key rows, as the prefill writes them (compression leaves them bitwise)
        with torch.no_grad():
            full = DynamicCache()
            model.model(input_ids=context, past_key_values=full)
            return [layer.keys[0].clone() for layer in full.layers]

    keys_of = {id(eager): prefill_keys(eager), id(sdpa): prefill_keys(sdpa)}
    results = {"prompt_ids": ids, "torch": torch.__version__, "cases": {}}
    for name, policy, params, ratio, budget in CASES:
        if only and not any(part in name for part in only):
            continue
        rerotate = name.startswith(REROTATE)
        model = sdpa if policy in ("adakv", "pyramidkv") else eager
        if budget is None:
            press = presses[policy](compression_ratio=ratio, **params)
            press = KeyRerotationPress(press) if rerotate else press
            decoding = None
        else:
            press = None
            decoding = DecodingPress(
                base_press=presses[policy](**params), target_size=budget[0], compression_interval=budget[1]
            )
        cache, turned = DynamicCache(), {}
        with torch.no_grad():
            if press is not None:
                with press(model), _recording_rerotation(KeyRerotationPress, turned):
                    model.model(input_ids=context, past_key_values=cache)
            else:
                model.model(input_ids=context, past_key_values=cache)
            if rerotate:  # turned keys match no row bit for bit: the press's own kept indices say where they came from
                rows = [turned[layer] for layer in range(len(cache.layers))]
            elif policy == "adakv":  # every row stays; each layer's attention masks what its heads evicted
                rows = [_unmasked(layer.self_attn, n) for layer in model.model.layers]
            else:
                rows = [
                    _match_rows(layer.keys[0], keys, [list(range(n))] * len(keys))
                    for layer, keys in zip(cache.layers, keys_of[id(model)])
                ]
            # the pipeline's first position: after the context, or after what was kept once its keys are turned
            steps, tokens, token, position = [], [], ids[-1], cache.get_seq_length() if rerotate else n
            with decoding(model) if decoding is not None else _nothing():
                for _ in range(STEPS):
                    before = [layer.keys[0].clone() for layer in cache.layers]
                    logits = model(
                        input_ids=torch.tensor([[token]]),
                        past_key_values=cache,
                        position_ids=torch.tensor([[position]]),
                    ).logits[0, -1]
                    # The rows now: copies of the rows before this pass plus this pass's own (the last before it
                    # was compressed); match each to where it came from.
                    if policy == "adakv":  # the masked rows hold fake keys, written anew each pass: nothing to match
                        rows = [[p + [n + len(steps)] for p in r] for r in rows]
                    else:
                        rows = [
                            _match_rows(
                                layer.keys[0],
                                torch.cat((old, layer_new(layer, old)), dim=1),
                                [p + [n + len(steps)] for p in r],
                            )  # its place in the sequence
                            for layer, old, r in zip(cache.layers, before, rows)
                        ]
                    token = int(logits.argmax())
                    top = logits.topk(TOP_IDS).indices.tolist()
                    steps.append(
                        {
                            "top_ids": top,
                            "top_logits": [float(logits[i]) for i in top],
                            **({"logits": logits.tolist()} if not steps else {}),
                        }
                    )
                    tokens.append(token)
                    position += 1
                    if len(steps) == 1:
                        first_rows = rows
        results["cases"][name] = {
            "kept_after_prefill": first_rows if budget is None else None,
            "kept_final": rows,
            "tokens": tokens,
            "steps": steps,
        }
        print(name, tokens, flush=True)
        Path(out).write_text(json.dumps(results))  # after each case: a long run's cases so far can be compared


class _recording_rerotation:
    """While entered, KeyRerotationPress records each layer's kept indices (per KV head, ascending) in `turned`."""

    def __init__(self, press_class, turned: dict):
        self.press_class, self.turned = press_class, turned

    def __enter__(self):
        original = self.original = self.press_class.rerotate_keys
        turned = self.turned

        def recording(module, indices, keys):
            turned[module.layer_idx] = indices[0].tolist()
            return original(module, indices, keys)

        self.press_class.rerotate_keys = staticmethod(recording)
        return self

    def __exit__(self, *exc):
        self.press_class.rerotate_keys = staticmethod(self.original)
        return False


def _unmasked(attention, n: int) -> list[list[int]]:
    """Per KV head: the rows of an n-row cache that AdaKV left unmasked (`masked_key_indices`, set by its press)."""
    _, heads, rows = attention.masked_key_indices
    kv_heads = attention.config.num_key_value_heads
    masked = [set() for _ in range(kv_heads)]
    for h, r in zip(heads.tolist(), rows.tolist()):
        masked[h].add(r)
    return [[r for r in range(n) if r not in masked[h]] for h in range(kv_heads)]


def layer_new(layer, old):
    """(kv_heads, 1, D): this pass's key row per head. A pass appends one row; if the press then compressed, it is
    the row the old ones lack, or gone (then a NaN row, which matches nothing)."""
    import torch

    keys = layer.keys[0]  # (kv_heads, rows, D)
    if keys.shape[1] == old.shape[1] + 1:
        return keys[:, -1:]
    new = []
    for h in range(keys.shape[0]):
        known = (keys[h][:, None, :] == old[h][None, :, :]).all(dim=-1).any(dim=1)  # (rows,)
        fresh = torch.nonzero(~known).flatten()
        new.append(keys[h, fresh[0]] if len(fresh) else torch.full_like(keys[h, 0], float("nan")))
    return torch.stack(new)[:, None]


def _match_rows(rows, source, source_positions) -> list[list[int]]:
    """Per KV head: the position of each cached row, found as the source row it equals bit for bit (source row i
    of head h is at source_positions[h][i])."""
    out = []
    for h in range(rows.shape[0]):
        where = {}
        for i, key in enumerate(_row_bits(source[h])):
            where.setdefault(key, []).append(source_positions[h][i])
        found = [where.get(key, []) for key in _row_bits(rows[h])]
        if any(len(f) != 1 for f in found):
            raise RuntimeError(f"a row of head {h} matches {[len(f) for f in found]} source rows")
        out.append([f[0] for f in found])
    return out


def _row_bits(rows) -> list[bytes]:
    """Each row's exact bits (float32 rows; a NaN row's bits match no cached row)."""
    data = rows.contiguous().numpy()
    return [data[i].tobytes() for i in range(data.shape[0])]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- ours, in the project's environment ---------------------------------------------------------------


def run_compare(model_spec: str, peer_file: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    import engine
    from engine.eviction import DecodeBudget, EvictionRun, Policy

    peer = json.loads(Path(peer_file).read_text())
    model = engine.load_model(model_spec, device="cpu")
    ids = peer["prompt_ids"]
    assert ids == prompt_ids(model.tokenizer), "the tokenizers split the prompt differently"
    print(f"{'case':32} {'kept equal':>22} {'max|Δlogit| first':>18} {'max|Δlogit| top ids':>20} {'tokens equal':>13}")
    for name, policy, params, ratio, budget in CASES:
        if name not in peer["cases"]:
            continue  # the peer's run stopped before this case
        theirs = peer["cases"][name]
        run = EvictionRun(
            model,
            ids,
            Policy(policy, **params),
            compression_ratio=ratio,
            budget=DecodeBudget(*budget) if budget else None,
            max_new_tokens=STEPS,
            rerotate=name.startswith(REROTATE),
        )
        run.prefill()
        kept_first = _kept(run)
        while not run.finished and len(run.steps) < STEPS:
            run.step()
        ours_kept = _kept(run)
        if budget is None:
            kept_equal, total = _count_equal(kept_first, theirs["kept_after_prefill"])
        else:
            kept_equal, total = _count_equal(ours_kept, theirs["kept_final"])
        first = (run.steps[0].logits - torch.tensor(theirs["steps"][0]["logits"])).abs().max().item()
        later = max(
            (
                abs(float(step.logits[i]) - v)
                for step, t in zip(run.steps, theirs["steps"])
                for i, v in zip(t["top_ids"], t["top_logits"])
            ),
            default=0.0,
        )
        tokens = [s.token_id for s in run.steps]
        same = tokens == theirs["tokens"][: len(tokens)]
        print(
            f"{name:32} {f'{kept_equal}/{total} (layer, head)':>22} {first:18.2e} {later:20.2e} {str(same):>13}"
            + ("" if same else f"  ours {tokens} theirs {theirs['tokens']}")
        )
        run.close()


def _kept(run) -> list[list[list[int]]]:
    """Per layer, per KV head: the positions held before the latest pass's own (as the peer records after a pass)."""
    info = run.model.info
    return [[run.kept_positions(layer, h) for h in range(info.kv_heads)] for layer in range(info.layers)]


def _count_equal(ours, theirs) -> tuple[int, int]:
    pairs = [(o, sorted(t)) for layer_o, layer_t in zip(ours, theirs) for o, t in zip(layer_o, layer_t)]
    return sum(o == t for o, t in pairs), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side", choices=["peer", "compare"])
    parser.add_argument("--model", required=True, help="peer: an HF model folder; compare: an engine model spec")
    parser.add_argument("--out", default="/tmp/kvpress_peer.json")
    parser.add_argument("--peer", default="/tmp/kvpress_peer.json")
    parser.add_argument("--cases", nargs="*", default=[], help="peer: only the cases whose name holds one of these")
    args = parser.parse_args()
    if args.side == "peer":
        run_peer(os.path.expanduser(args.model), args.out, args.cases)
    else:
        run_compare(args.model, args.peer)


if __name__ == "__main__":
    main()
