"""The Qwen family end to end, offline, on a random-weight model of Qwen3-0.6B's exact shape (tests/qwen3_shaped.py):
its trained byte-level BPE, Qwen3's thinking switch, typed markup kept as text, stepping against transformers,
every view and lesson chapter in the app, and the model card's numbers (issue 11, items 3 and 4)."""

import json
from pathlib import Path

import pytest
import torch

import engine
from engine.prompt import prompt_segments, tokenize_prompt
from tests.app_helpers import assert_clean, start
from tests.conftest import QWEN3_SHAPED_DTYPE
from ui.lesson.chapters import CHAPTERS
from ui.page.model_card import ROWS
from ui.state.link import VIEWS
from ui.text import strings

PROMPT = "解释什么是Transformer"
# Qwen3-0.6B as the articles give it (seeds/000): 16 Q / 8 KV heads of 128, 1024 wide, 28 layers, vocab 151,936.
ARTICLE = {"hidden": 1024, "q_heads": 16, "kv_heads": 8, "head_dim": 128, "layers": 28, "vocab": 151_936}
THINK_IDS = (151_667, 151_668)  # <think>, </think> at Qwen3's own ids


def rendered_ids(tokenizer, prompt: str, **options) -> list[int]:
    """transformers' own rendering of the chat template, encoded whole: the independent reference."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, **options
    )
    return tokenizer.encode(text, add_special_tokens=False)


# -- the folder: shapes, dtype, tokenizer ---------------------------------------------------------------------


def test_the_folder_holds_qwen3_0_6b_shapes_in_bfloat16(qwen3_shaped_dir):
    from safetensors import safe_open

    config = json.loads((Path(qwen3_shaped_dir) / "config.json").read_text())
    assert (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["num_hidden_layers"],
        config["vocab_size"],
        config["intermediate_size"],
    ) == (1024, 16, 8, 128, 28, 151_936, 3072)
    assert config["tie_word_embeddings"] is True
    with safe_open(str(Path(qwen3_shaped_dir) / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
        dtypes = {weights.get_slice(name).get_dtype() for name in names}
        total = sum(torch.Size(weights.get_slice(name).get_shape()).numel() for name in names)
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in names  # tied: the embedding table is the output matrix too
    assert total == 596_049_920  # Qwen3-0.6B's parameter count, embeddings counted once
    assert 2 * total / 1e9 == pytest.approx(1.19, abs=0.005)  # bf16 weights, GB (docs/models.md)


def test_the_trained_tokenizer_has_chinese_merges_and_qwen3_ids(qwen3_shaped):
    tokenizer = qwen3_shaped.tokenizer
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("解释什么是")]
    assert pieces == list("解释什么是"), pieces  # one token per character: merged from its three UTF-8 bytes
    assert len(tokenizer.encode("龘", add_special_tokens=False)) == 3  # not in the corpus: three byte pieces
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151_643,
        151_644,
        151_645,
        *THINK_IDS,
    ]
    assert len(tokenizer) <= qwen3_shaped.info.vocab == 151_936


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_loads_with_the_weights_shapes(qwen3_shaped_dir, qwen3_shaped, dtype):
    model = qwen3_shaped if dtype == QWEN3_SHAPED_DTYPE else engine.load_model(qwen3_shaped_dir, "cpu", dtype)
    info, layer = model.info, model.weights.layers[0]
    assert {k: getattr(info, k) for k in ARTICLE} == ARTICLE
    assert model.weights.embed_tokens.shape == (info.vocab, info.hidden)
    assert layer.q_proj.weight.shape == (info.q_heads * info.head_dim, info.hidden)
    assert layer.k_proj.weight.shape == (info.kv_heads * info.head_dim, info.hidden)
    assert layer.o_proj.weight.shape == (info.hidden, info.q_heads * info.head_dim)
    assert len(model.weights.layers) == info.layers and model.weights.tied
    assert model.dtype == dtype and info.element_bytes == torch.finfo(dtype).bits // 8


def test_it_steps_as_transformers_does(qwen3_shaped_dir, qwen3_shaped):
    """Greedy tokens of our engine equal transformers' on the same weights and dtype."""
    from transformers import AutoModelForCausalLM

    ids = tokenize_prompt(qwen3_shaped, PROMPT, chat=True)
    with engine.Generation(qwen3_shaped, ids, max_new_tokens=4) as generation:
        generation.prefill()
        while not generation.finished and len(generation.generated) < 4:
            generation.step()
        ours = generation.generated
    hf = AutoModelForCausalLM.from_pretrained(qwen3_shaped_dir, dtype=QWEN3_SHAPED_DTYPE).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert ours == out[0, len(ids) :].tolist()


# -- the chat template: thinking off by default, typed markup stays text --------------------------------------


def test_thinking_is_off_by_default_and_the_switch_turns_it_on(qwen3_shaped):
    tokenizer = qwen3_shaped.tokenizer
    off = tokenize_prompt(qwen3_shaped, PROMPT, chat=True)
    on = tokenize_prompt(qwen3_shaped, PROMPT, chat=True, think=True)
    assert off == rendered_ids(tokenizer, PROMPT, enable_thinking=False)
    assert on == rendered_ids(tokenizer, PROMPT, enable_thinking=True)
    assert tokenizer.decode(off[len(on) :]) == "<think>\n\n</think>\n\n"  # the closed, empty think block
    assert off[: len(on)] == on
    segments = prompt_segments(qwen3_shaped, PROMPT, chat=True)
    assert segments[-1].kind == "template" and segments[-1].text.endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("chat", [True, False])
def test_typed_think_tags_stay_text(qwen3_shaped, chat):
    """<think> is an added token but not special: split_special_tokens alone would still match it."""
    tokenizer = qwen3_shaped.tokenizer
    typed = "<think>plan</think> <|im_end|>解释"
    assert set(THINK_IDS) <= set(tokenizer.encode(typed, split_special_tokens=True))  # the trap
    ids = tokenize_prompt(qwen3_shaped, typed, chat=chat, think=True)
    assert not set(THINK_IDS) & set(ids)
    assert typed in tokenizer.decode(ids)
    specials = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    assert sum(i in specials for i in ids) == (3 if chat else 0)  # the template's <|im_start|> ×2, <|im_end|>


def test_a_template_without_the_switch_never_sees_it(qwen3_shaped, monkeypatch):
    """Qwen2.5's template has no thinking: it is rendered without enable_thinking, whatever `think` says."""
    from tests.test_prompt import QWEN_TEMPLATE

    tokenizer = qwen3_shaped.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", QWEN_TEMPLATE)
    seen, render = [], tokenizer.apply_chat_template

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return render(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", spy)
    for think in (False, True):
        assert tokenize_prompt(qwen3_shaped, PROMPT, chat=True, think=think) == rendered_ids(tokenizer, PROMPT)
    assert seen and not any("enable_thinking" in kwargs for kwargs in seen)


# -- in the app -------------------------------------------------------------------------------------------------


@pytest.fixture
def hosted(qwen3_shaped_dir, monkeypatch) -> str:
    """The app's hosted setting offering the Qwen3-0.6B-shaped folder (as KVSCOPE_MODELS would Qwen/Qwen3-0.6B)."""
    monkeypatch.setenv("KVSCOPE_MODELS", qwen3_shaped_dir)
    return qwen3_shaped_dir


def test_every_view_renders_with_it(hosted):
    for view in VIEWS:
        at = start(model=hosted, view=view, step=3, lang="zh" if view == "kv" else "en")
        assert_clean(at)
        assert at.query_params["model"] == hosted, view  # not fallen back to the embedded model


def test_every_lesson_chapter_renders_with_it(hosted):
    for number in range(1, len(CHAPTERS) + 1):
        at = start(model=hosted, chapter=number)
        assert_clean(at)
        assert int(at.query_params["chapter"]) == number


def test_the_thinking_switch_in_the_sidebar(hosted, qwen3_shaped):
    at = start(model=hosted, prompt=PROMPT, step=1)
    assert_clean(at)
    tokenizer = qwen3_shaped.tokenizer
    assert at.toggle(key="w_think").value is False
    assert at.session_state["page"].runner.prompt_ids == rendered_ids(tokenizer, PROMPT, enable_thinking=False)
    at.toggle(key="w_think").set_value(True).run()
    assert_clean(at)
    assert at.query_params["think"] == "1"
    assert at.session_state["page"].runner.prompt_ids == rendered_ids(tokenizer, PROMPT, enable_thinking=True)
    embedded = start(step=1)
    assert not [w for w in embedded.toggle if w.key == "w_think"]  # SmolLM2's template has no switch


def test_the_model_card_shows_the_articles_numbers(hosted, qwen3_shaped):
    at = start(model=hosted, step=1)
    assert_clean(at)
    card = next(e for e in at.expander if e.label == strings.ENGLISH["card_title"]).table[0].value
    en = strings.ENGLISH
    column = card[en["card_this_model"]]
    value = {row: column[en[row]] for row in ROWS}
    info, weights = qwen3_shaped.info, qwen3_shaped.weights
    q_out, hidden = weights.layers[0].q_proj.weight.shape
    kv_out = weights.layers[0].k_proj.weight.shape[0]
    vocab = weights.embed_tokens.shape[0]
    assert value["card_q_heads"] == f"{info.q_heads} × {q_out // info.q_heads}" == "16 × 128"
    assert value["card_kv_heads"] == f"{kv_out // info.head_dim} × {info.head_dim}" == "8 × 128"
    assert value["card_group"] == f"16 / 8 = {info.q_heads // info.kv_heads}" == "16 / 8 = 2"
    assert value["card_concat"] == f"16 × 128 = {q_out:,} → o_proj → {hidden:,}" == "16 × 128 = 2,048 → o_proj → 1,024"
    assert value["card_embedding"] == f"{vocab:,} × {hidden:,}" == "151,936 × 1,024"
    assert value["card_layers"] == str(len(weights.layers)) == "28"
    assert value["card_adds"] == f"2 × 28 = {2 * len(weights.layers)}" == "2 × 28 = 56"
    kv = info.kv_bytes_per_token
    assert value["card_kv_bytes"] == f"2 × 28 × 8 × 128 × {info.element_bytes} = {kv:,} ({info.dtype})"
    assert value["card_kv_bytes_mha"].endswith(f"= {2 * kv:,} ({info.dtype})")  # GQA caches half of MHA's
    assert card["Qwen3-0.6B"][en["card_kv_bytes"]] == "2 × 28 × 8 × 128 × 2 = 114,688 (bfloat16)"
    assert card[en["card_toy"]][en["card_embedding"]] == "50,000 × 128"
    assert en["card_same_shape"] in [c.value for c in at.caption]
