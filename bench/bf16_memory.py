"""Peak resident memory of loading and stepping a Qwen3-0.6B-shaped model in bfloat16.

    HF_HUB_OFFLINE=1 python bench/bf16_memory.py [--folder DIR] [--dtype bfloat16] [--steps 8]

(--folder takes any model spec, e.g. `embedded-zh`: the same figures for a process holding that model.)

Without --folder, a random-weight model of Qwen3-0.6B's exact shape (hidden 1024, 16 Q / 8 KV heads
of 128, intermediate 3072, 28 layers, vocab 151936, tied embeddings) is saved in bfloat16 as safetensors
with the embedded SmolLM2 tokenizer. Then a fresh subprocess (the high-water mark only grows) imports the
engine, loads the model, prefills a 32-token prompt and decodes `steps` tokens, and reports:
imports_mb (resident after importing torch, transformers and the engine), loaded_mb (after the load),
peak_mb (the process's VmHWM over everything), weights_mb (the weights' own bytes). Run by hand; the
same measurement bounds the peak in tests/test_bf16.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_IDS = list(range(10, 42))  # 32 token ids, below every tokenizer's size


def status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS: resident now, VmHWM: its high-water mark), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    raise KeyError(field)


def weight_bytes(model) -> int:
    """Bytes of the model's distinct weight tensors (a tied lm_head and the stacked projections' views count once)."""
    return model.info.parameters * model.weights.embed_tokens.element_size()


def measure(folder: str, dtype_name: str, steps: int) -> dict:
    """In this process: import, load `folder` in `dtype_name`, prefill 32 tokens, decode `steps`."""
    import torch

    import engine

    imports = status_mb("VmRSS")
    start = time.perf_counter()
    model = engine.load_model(folder, device="cpu", dtype=getattr(torch, dtype_name))
    load_s = time.perf_counter() - start
    loaded = status_mb("VmRSS")
    with engine.Generation(model, PROMPT_IDS, max_new_tokens=steps + 1) as generation:
        generation.prefill()
        for _ in range(steps):
            generation.step()
    return {
        "dtype": model.info.dtype,
        "kv_bytes_per_token": model.info.kv_bytes_per_token,
        "parameters": model.info.parameters,
        "weights_mb": round(weight_bytes(model) / 1e6),
        "imports_mb": round(imports),
        "loaded_mb": round(loaded),
        "peak_mb": round(status_mb("VmHWM")),
        "load_s": round(load_s, 1),
        "tokens": generation.generated,
    }


def measure_in_subprocess(folder: str, dtype_name: str = "bfloat16", steps: int = 8) -> dict:
    """`measure` in a fresh Python process, so the peak is this load's alone."""
    command = [sys.executable, __file__, "--child", "--folder", folder, "--dtype", dtype_name, "--steps", str(steps)]
    out = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default=None, help="a saved model; default: build the Qwen3-0.6B-shaped one")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.folder, args.dtype, args.steps)))
        return
    folder = args.folder
    if folder is None:
        import torch

        from bench.engine_bench import qwen3_shaped_folder
        from engine import embedded

        folder = qwen3_shaped_folder(torch.bfloat16, embedded.embedded_source())
    print(json.dumps(measure_in_subprocess(folder, args.dtype, args.steps)))


if __name__ == "__main__":
    main()
