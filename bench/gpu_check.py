"""On a CUDA machine: the engine against transformers on the GPU (exactness), then step timings.

    HF_HUB_OFFLINE=1 python bench/gpu_check.py [--steps 32]

Exactness: the embedded model and a random Qwen3-0.6B-shaped model, prefill and greedy decode on
`device="auto"` (CUDA): max |logits difference| per step against transformers on the same GPU,
identical greedy tokens, and the cached K/V. Timing: `bench/engine_bench.py` on the same device.
Exits non-zero when CUDA is missing or a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import engine  # noqa: E402
from bench.engine_bench import qwen3_shaped_folder, run  # noqa: E402
from engine import embedded  # noqa: E402


def exactness(spec: str, steps: int) -> dict:
    model = engine.load_model(spec, device="auto")
    assert model.device.type == "cuda", "device='auto' did not pick CUDA"
    source = embedded.embedded_source() if spec == "embedded" else spec
    hf = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager")
    hf = hf.to(model.device).eval()
    prompt = list(range(100, 164))
    generation = engine.Generation(model, prompt, max_new_tokens=steps + 1)
    trace = generation.prefill()
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor([prompt], device=model.device), use_cache=True)
    worst_logits, worst_kv, same_tokens = 0.0, 0.0, True
    for step in range(steps + 1):
        theirs = out.logits[0, -1].float().cpu()
        worst_logits = max(worst_logits, (trace.logits - theirs).abs().max().item())
        same_tokens &= trace.token_id == int(theirs.argmax())
        for layer in range(model.info.layers):
            k, v = generation.pool.read(layer, generation.table.device_blocks(), generation.table.length)
            cached = out.past_key_values.layers[layer]
            worst_kv = max(
                worst_kv,
                (k.permute(1, 0, 2) - cached.keys[0]).abs().max().item(),
                (v.permute(1, 0, 2) - cached.values[0]).abs().max().item(),
            )
        if step == steps:
            break
        with torch.inference_mode():
            out = hf(
                input_ids=torch.tensor([[trace.token_id]], device=model.device),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        trace = generation.step()
    ok = worst_logits <= 1e-4 and worst_kv <= 1e-4 and same_tokens
    return {
        "model": model.info.name,
        "device": torch.cuda.get_device_name(model.device),
        "steps": steps,
        "max_abs_logits_diff": worst_logits,
        "max_abs_kv_diff": worst_kv,
        "same_greedy_tokens": same_tokens,
        "pass": ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here")
        return 2
    results = []
    for spec in ("embedded", qwen3_shaped_folder()):
        results.append(exactness(spec, args.steps))
        print(json.dumps(results[-1], indent=1))
        print(json.dumps(run(spec, 48, 200, "cuda"), indent=1))
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
