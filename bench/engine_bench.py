"""The engine's decode step against transformers' own cached decode, on the same weights, interleaved.

    HF_HUB_OFFLINE=1 python bench/engine_bench.py [--steps 48] [--context 200] [--device auto] [--dtype both]

Models: the embedded SmolLM2-135M (`embedded`), the embedded Gemma 3 270M (`embedded-zh`, by `--models`) and a
random-weight model with Qwen3-0.6B's real widths (hidden
1024, 16 Q / 8 KV heads of 128, intermediate 3072, 28 layers, vocab 151936). For each: prefill
tokens per second; the engine's load time; per-step medians of (a) the engine with full traces, (b) the engine recording
only ids, text and candidates, (c) transformers with `past_key_values`; their ratio; peak memory;
and the memory-bandwidth bound (engine.timing: bytes a decode step reads ÷ peak read bandwidth). Run by hand, not in CI.

--dtype float32, bfloat16 or both: each (model, dtype) runs in a fresh subprocess, so its peak memory is
its own. The Qwen3-shaped weights are saved once in bfloat16, so float32 runs the same numbers, upcast.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config  # noqa: E402

import engine  # noqa: E402
from engine import embedded  # noqa: E402
from engine.reference_models import QWEN3_0_6B  # noqa: E402
from engine.timing import decode_step_bytes, peak_read_bandwidth  # noqa: E402


def bandwidth_gb_s(device: torch.device) -> float:
    """Peak read bandwidth, measured as the app measures it (engine.timing)."""
    return peak_read_bandwidth(device) / 1e9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# Qwen3-0.6B's published sizes (engine.reference_models), with token ids the word-level tokenizer has.
QWEN3_06B_SHAPE = {k: v for k, v in QWEN3_0_6B.items() if k not in ("model_type", "torch_dtype")} | dict(
    eos_token_id=0, bos_token_id=0
)


def qwen3_shaped_folder(
    dtype: torch.dtype = torch.float32, tokenizer_folder: str | None = None, parent: str | None = None
) -> str:
    """A folder with random weights at Qwen3-0.6B's widths, saved as safetensors in `dtype`.

    The tokenizer is the one saved in `tokenizer_folder` (its ids must stay below the vocabulary size),
    or else a word-level one of the full vocabulary. The folder is made under `parent` (default: the temp dir).
    """
    folder = Path(tempfile.mkdtemp(prefix="kvscope-qwen3-shape-", dir=parent))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_06B_SHAPE), dtype=dtype).save_pretrained(folder)
    if tokenizer_folder is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_folder).save_pretrained(folder)
    else:
        word_level_tokenizer(QWEN3_06B_SHAPE["vocab_size"]).save_pretrained(folder)
    return str(folder)


def word_level_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """Words w0 … w{vocab−1}, one id each: random prompts decode and re-encode to the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w0")


def run(spec: str, steps: int, context: int, device: str, dtype: torch.dtype = torch.float32) -> dict:
    start = time.perf_counter()
    model = engine.load_model(spec, device=device, dtype=dtype)
    load_s = time.perf_counter() - start
    source = {"embedded": embedded.embedded_source, embedded.ZH: embedded.zh_source}.get(spec, lambda: spec)()
    hf = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(model.device).eval()
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, min(model.info.vocab, len(model.tokenizer)), (context,), generator=generator).tolist()
    generations = {
        "engine, full traces": engine.Generation(model, prompt, max_new_tokens=steps + 2),
        "engine, ids+text only": engine.Generation(
            model, prompt, max_new_tokens=steps + 2, capture=engine.Capture(attention=False, residuals=False)
        ),
    }
    prefill = {}
    for name, generation in generations.items():
        sync(model.device)
        start = time.perf_counter()
        generation.prefill()
        sync(model.device)
        prefill[name] = context / (time.perf_counter() - start)
    with torch.inference_mode():
        sync(model.device)
        start = time.perf_counter()
        out = hf(input_ids=torch.tensor([prompt], device=model.device), use_cache=True)
        sync(model.device)
        prefill["transformers"] = context / (time.perf_counter() - start)
    cache = out.past_key_values
    token = int(out.logits[0, -1].argmax())
    times: dict[str, list[float]] = {name: [] for name in (*generations, "transformers")}
    for _ in range(steps):  # interleaved, so all three see the same machine state
        for name, generation in generations.items():
            sync(model.device)
            start = time.perf_counter()
            generation.step()
            sync(model.device)
            times[name].append(time.perf_counter() - start)
        with torch.inference_mode():
            sync(model.device)
            start = time.perf_counter()
            out = hf(input_ids=torch.tensor([[token]], device=model.device), past_key_values=cache, use_cache=True)
            sync(model.device)
            times["transformers"].append(time.perf_counter() - start)
        cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
    medians = {name: 1000 * statistics.median(values) for name, values in times.items()}
    bound_ms = 1000 * decode_step_bytes(model.info, context + steps // 2) / (bandwidth_gb_s(model.device) * 1e9)
    return {
        "model": model.info.name,
        "dtype": model.info.dtype,
        "threads": torch.get_num_threads(),
        "parameters": model.info.parameters,
        "device": str(model.device),
        "context": context,
        "steps": steps,
        "load_s": round(load_s, 1),
        "median_ms": {k: round(v, 2) for k, v in medians.items()},
        "ratio_full_vs_transformers": round(medians["engine, full traces"] / medians["transformers"], 3),
        "ratio_ids_only_vs_transformers": round(medians["engine, ids+text only"] / medians["transformers"], 3),
        "prefill_tokens_per_s": {k: round(v, 1) for k, v in prefill.items()},
        "bandwidth_bound_ms": round(bound_ms, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--models", nargs="*", default=["embedded", "qwen3-shape"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "both"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a model spec, run in this process
    args = parser.parse_args()
    if args.threads:  # a busy shared machine: one thread each spares OpenMP's barriers from waiting on others
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(run(args.child, args.steps, args.context, args.device, getattr(torch, args.dtype))))
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"read bandwidth {bandwidth_gb_s(engine.loader.resolve_device(args.device)):.1f} GB/s"
    )
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    for name in args.models:
        spec = qwen3_shaped_folder(torch.bfloat16) if name == "qwen3-shape" else name
        for dtype in dtypes:
            command = [
                sys.executable,
                __file__,
                "--child",
                spec,
                "--dtype",
                dtype,
                "--steps",
                str(args.steps),
                "--context",
                str(args.context),
                "--device",
                args.device,
            ]
            command += ["--threads", str(args.threads)] if args.threads else []
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            print(out.stdout.strip() or out.stderr.strip()[-2000:], flush=True)


if __name__ == "__main__":
    main()
