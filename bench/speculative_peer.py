"""Our speculative decoding (engine/speculative.py) against transformers' assisted generation (5.24) on the same
weights and the same prompt ids, greedy: per pass of the full model the draft's guesses, the guesses kept and the
tokens the pass added, and the final tokens must be the same.

    HF_HUB_OFFLINE=1 python3 bench/speculative_peer.py compare          # runs `peer` in its own process per model
    HF_HUB_OFFLINE=1 python3 bench/speculative_peer.py peer --model embedded --out /tmp/speculative_peer.json
    HF_HUB_OFFLINE=1 python3 bench/speculative_peer.py compare --models embedded --peer /tmp/speculative_peer.json

Models: `embedded` (SmolLM2-135M-Instruct, chat template on) and `embedded-zh` (Gemma 3 270M, a base model: no
template, Chinese prompts), both read from the engine's converted float32 folder (`engine.embedded`) on both sides,
float32, eager attention on the transformers side. Each has a prompt whose answer quotes it (`quote`) and one whose
answer does not (`free`); 40 new tokens; the cases (`cases`):
- prompt lookup, k = 2, 5, 8: `generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=2)`;
- early exit, (k, n) per model: `generate(assistant_early_exit=n)`. Its candidate generator reads the number of
  guesses, their schedule and the confidence stop from the *assistant's* generation_config (here the model's own),
  not from generate()'s arguments: `peer` sets num_assistant_tokens=k, num_assistant_tokens_schedule="constant" and
  assistant_confidence_threshold=0 there (by default 20 guesses, and a stop once the draft's top probability falls
  under 0.4), as our engine guesses k a pass and has no confidence stop. (Passed to generate() instead,
  num_assistant_tokens=5 leaves the passes guessing 1 to 20 tokens.)

`peer` runs transformers, unchanged, on the ids `compare` gives it (`--ids`; alone, its own tokenization) and
records each pass by wrapping the candidate generator `generate` builds (`_get_candidate_generator`, patched on the
model instance): `get_candidates` gives the pass's guesses, `update_candidate_strategy` the full model's argmax per
row and the ids after the pass. transformers keeps the guesses up to the first miss (`accepted`, our
`VerifyPass.accepted`), then cuts the accepted tokens after an end-of-sequence token or at max_length and recomputes
n_matches from what is left: the pass added n_matches + 1 tokens (our `len(VerifyPass.added)`).
`compare` prints one row per case (| case | model | passes | accepted | added | guesses | tokens equal |) and, below
the table, the first pass where a case differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NEW_TOKENS = 40
MAX_NGRAM = 2
LOOKUP_K = (2, 5, 8)


@dataclass(frozen=True)
class ModelCases:
    """A model's prompts (name → text), whether they go through its chat template, and its early-exit (k, n)."""

    chat: bool
    prompts: dict[str, str]
    early_exit: tuple[tuple[int, int], ...]


MODELS = {
    "embedded": ModelCases(  # SmolLM2-135M-Instruct, 30 layers
        chat=True,
        prompts={
            "quote": "Rewrite this Python function with the variable `total` renamed to `acc`. Reply with the code "
            "only.\n\n```python\ndef sum_of_squares(values):\n    total = 0\n    for value in values:\n"
            "        total += value * value\n    return total\n```",
            "free": "Why do leaves change colour in autumn? Answer in a short paragraph.",
        },
        early_exit=((5, 10), (3, 20)),
    ),
    "embedded-zh": ModelCases(  # Gemma 3 270M, a base model, 18 layers
        chat=False,
        prompts={
            "quote": "原文：春天来了，小草从地里钻出来，柳树发出了嫩芽。小燕子从南方飞回来，在屋檐下筑巢。"
            "孩子们脱下厚厚的棉衣，到田野里放风筝。\n照抄一遍：春天来了，",
            "free": "人工智能的发展给我们的生活带来了",
        },
        early_exit=((5, 6), (3, 12)),
    ),
}


@dataclass(frozen=True)
class Case:
    prompt: str  # a key of the model's prompts
    draft: str  # "lookup" or "early_exit"
    k: int
    layers: int = 0  # early exit's n

    @property
    def name(self) -> str:
        return (
            f"{self.prompt} lookup k={self.k}"
            if self.draft == "lookup"
            else f"{self.prompt} early_exit k={self.k} n={self.layers}"
        )


def cases(spec: str) -> list[Case]:
    model = MODELS[spec]
    return [
        case
        for prompt in model.prompts
        for case in [Case(prompt, "lookup", k) for k in LOOKUP_K]
        + [Case(prompt, "early_exit", k, n) for k, n in model.early_exit]
    ]


def folder(spec: str) -> str:
    """The engine's converted float32 folder of an embedded model (converting it on first use)."""
    import torch

    from engine import embedded

    source = embedded.embedded_source(torch.float32) if spec == "embedded" else embedded.zh_source(torch.float32)
    if not isinstance(source, str) or not Path(source).is_dir():
        raise SystemExit(f"{spec}: no converted folder ({source!r}); the cache must be writable")
    return source


# -- the peer: transformers' assisted generation -----------------------------------------------------------------


def template_ids(tokenizer, text: str, chat: bool) -> list[int]:
    """The prompt's ids as transformers' own tokenizer makes them."""
    if chat:
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
    return tokenizer(text)["input_ids"]


def recorded(generator, passes: list[dict]):
    """`generator` with its two per-pass calls recording into `passes` (one dict a pass of the full model)."""
    get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

    def recording_get(input_ids, **kwargs):
        candidate_ids, candidate_logits = get_candidates(input_ids, **kwargs)
        passes.append({"length": input_ids.shape[1], "guesses": candidate_ids[0, input_ids.shape[1] :].tolist()})
        return candidate_ids, candidate_logits

    def recording_update(input_ids, scores, num_matches):
        done = passes[-1]
        top = scores[0].argmax(-1).tolist()  # greedy: the full model's token after each row
        guesses = done["guesses"]
        done.update(
            top=top,
            accepted=next((i for i, g in enumerate(guesses) if g != top[i]), len(guesses)),
            n_matches=int(num_matches),
            added=input_ids[0, done["length"] :].tolist(),
        )
        return update(input_ids, scores, num_matches)

    generator.get_candidates, generator.update_candidate_strategy = recording_get, recording_update
    return generator


def peer_case(hf, ids: list[int], case: Case) -> dict:
    import torch

    passes: list[dict] = []
    build = type(hf)._get_candidate_generator
    hf._get_candidate_generator = lambda **kwargs: recorded(build(hf, **kwargs), passes)
    options = dict(do_sample=False, max_new_tokens=NEW_TOKENS)
    if case.draft == "lookup":
        options.update(prompt_lookup_num_tokens=case.k, max_matching_ngram_size=MAX_NGRAM)
    else:  # read by the candidate generator from the assistant's (here the model's own) generation_config
        hf.generation_config.num_assistant_tokens = case.k
        hf.generation_config.num_assistant_tokens_schedule = "constant"
        hf.generation_config.assistant_confidence_threshold = 0  # off
        options.update(assistant_early_exit=case.layers)
    try:
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **options)
    finally:
        del hf._get_candidate_generator
    return {"tokens": out[0, len(ids) :].tolist(), "passes": passes}


def run_peer(spec: str, model_dir: str, ids_file: str | None, out: str) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = MODELS[spec]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    own = {name: template_ids(tokenizer, text, model.chat) for name, text in model.prompts.items()}
    given = json.loads(Path(ids_file).read_text()) if ids_file else own
    results = {
        "transformers": transformers.__version__,
        "folder": model_dir,
        "template_ids": own,
        "ids": given,
        "eos_token_id": hf.generation_config.eos_token_id,
        "cases": {},
    }
    for case in cases(spec):
        results["cases"][case.name] = peer_case(hf, given[case.prompt], case)
        print(f"peer {spec} {case.name}: {len(results['cases'][case.name]['passes'])} passes", flush=True)
        Path(out).write_text(json.dumps(results))


# -- ours, and the comparison -------------------------------------------------------------------------------------


def ours_case(model, ids: list[int], case: Case):
    from engine.drafts import make_draft
    from engine.speculative import SpeculativeGeneration

    draft = make_draft(case.draft, case.k, case.layers or 1, model, max_ngram=MAX_NGRAM)
    with SpeculativeGeneration(model, ids, draft, max_new_tokens=NEW_TOKENS) as generation:
        generation.run()
        return list(generation.generated), list(generation.passes)


def first_difference(ours: list, theirs: list) -> int | None:
    return next(
        (i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
        None if len(ours) == len(theirs) else min(len(ours), len(theirs)),
    )


def compare_model(spec: str, peer_file: str | None) -> tuple[list[str], list[str]]:
    """The table rows and the notes (differences) of one model."""
    import torch

    import engine
    from engine.prompt import tokenize_prompt

    model_dir = folder(spec)
    model = engine.load_model(model_dir, device="cpu", dtype=torch.float32)
    ids = {name: tokenize_prompt(model, text, MODELS[spec].chat) for name, text in MODELS[spec].prompts.items()}
    if peer_file is None:
        peer_file = run_peer_process(spec, model_dir, ids)
    peer = json.loads(Path(peer_file).read_text())
    notes = [
        f"{spec}: transformers {peer['transformers']}, folder {model_dir}; prompt ids equal to the chat "
        f"template's / tokenizer's: {peer['template_ids'] == ids}; fed to the peer: {peer['ids'] == ids} "
        f"({', '.join(f'{name} {len(v)} tokens' for name, v in ids.items())}); eos: ours "
        f"{sorted(model.eos_ids)}, transformers' generation_config {peer['eos_token_id']}"
    ]
    rows = []
    for case in cases(spec):
        theirs = peer["cases"].get(case.name)
        if theirs is None:
            notes.append(f"{spec} {case.name}: not in the peer's file")
            continue
        tokens, passes = ours_case(model, ids[case.prompt], case)
        columns = {
            "accepted": ([p.accepted for p in passes], [p["accepted"] for p in theirs["passes"]]),
            "added": ([len(p.added) for p in passes], [p["n_matches"] + 1 for p in theirs["passes"]]),
            "guesses": ([p.guesses for p in passes], [p["guesses"] for p in theirs["passes"]]),
        }
        same = {key: a == b for key, (a, b) in columns.items()}
        rows.append(
            f"| {case.name} | {spec} | {len(passes)} / {len(theirs['passes'])} | {yes(same['accepted'])} | "
            f"{yes(same['added'])} | {yes(same['guesses'])} | {yes(tokens == theirs['tokens'])} |"
        )
        for key, (a, b) in columns.items():
            if not same[key]:
                at = first_difference(a, b)
                notes.append(
                    f"{spec} {case.name}: {key} differ from pass {at}: ours {a[at : at + 3]}, "
                    f"transformers {b[at : at + 3]}"
                )
        if tokens != theirs["tokens"]:
            at = first_difference(tokens, theirs["tokens"])
            notes.append(
                f"{spec} {case.name}: tokens differ from token {at}: ours {tokens[at : at + 5]}, "
                f"transformers {theirs['tokens'][at : at + 5]}"
            )
    return rows, notes


def run_peer_process(spec: str, model_dir: str, ids: dict[str, list[int]]) -> str:
    """Run `peer` in its own process on our ids; the path of its JSON."""
    scratch = Path(tempfile.mkdtemp(prefix="speculative-peer-"))
    (scratch / "ids.json").write_text(json.dumps(ids))
    out = scratch / "peer.json"
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "peer",
            "--model",
            spec,
            "--folder",
            model_dir,
            "--ids",
            str(scratch / "ids.json"),
            "--out",
            str(out),
        ],
        check=True,
    )
    return str(out)


def yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side", choices=["peer", "compare"])
    parser.add_argument("--model", choices=list(MODELS), help="peer: the model")
    parser.add_argument("--folder", help="peer: its converted folder (default: the engine's)")
    parser.add_argument("--ids", help="peer: a JSON of prompt name → ids to feed (default: its own tokenization)")
    parser.add_argument("--out", default="/tmp/speculative_peer.json", help="peer: where to write")
    parser.add_argument("--models", nargs="*", choices=list(MODELS), default=list(MODELS), help="compare: which")
    parser.add_argument("--peer", help="compare: a peer JSON already written (one model); default: run the peer")
    args = parser.parse_args()
    if args.side == "peer":
        if args.model is None:
            parser.error("peer needs --model")
        run_peer(args.model, args.folder or folder(args.model), args.ids, args.out)
        return
    import torch

    torch.set_num_threads(1)
    if args.peer and len(args.models) != 1:
        parser.error("--peer holds one model's cases: name it with --models")
    table, notes = [], []
    for spec in args.models:
        rows, model_notes = compare_model(spec, args.peer)
        table += rows
        notes += model_notes
    print(
        "| case | model | passes (ours / peer) | accepted per pass equal | added per pass equal | "
        "guesses per pass equal | tokens equal |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
