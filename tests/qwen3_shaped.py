"""A random-weight model of Qwen3-0.6B's exact shape, with a byte-level BPE tokenizer trained here.

Offline and seeded: the tests of the Qwen family (tests/test_qwen.py) load it like any model folder.

Shape (Qwen3-0.6B's config): hidden 1024, 16 Q / 8 KV heads of 128, intermediate 3072, 28 layers,
vocab 151,936 rows, tied embeddings, q_norm/k_norm. Weights are saved in bfloat16 (safetensors), 1.19 GB.

Tokenizer: Qwen2's normalizer and pre-tokenizer (transformers' Qwen2Tokenizer) over a BPE trained on the
small English + Chinese corpus below, so common Chinese characters are single tokens and rarer ones are
split into byte pieces. Its vocabulary is padded with unreachable filler entries to Qwen's 151,643 regular
ids, then Qwen3's added tokens follow at Qwen3's own ids: <|endoftext|> 151643, <|im_start|> 151644,
<|im_end|> 151645, …, <think> 151667, </think> 151668 (the last two, as in Qwen3, not special).
Embedding rows of ids the trained BPE cannot produce are zero, so the random model's argmax picks real
tokens (a zero row scores 0; the largest of ~2,000 random scores is well above it).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS, VOCAB = 1024, 16, 8, 128, 3072, 28, 151_936
REGULAR_IDS = 151_643  # Qwen's byte-level BPE entries; its added tokens start here
TRAINED_VOCAB = 2_000
WEIGHT_STD = 0.02  # Qwen3's initializer_range

# Qwen3's added tokens in its order (ids 151643 …); (text, special). <tool_call>, <think> etc. are not special.
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Written for this test in the shape of Qwen3's template: thinking on unless `enable_thinking` is false, in
# which case the generation prompt closes an empty think block, as Qwen3's own template does.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

CORPUS = """
What is a KV cache? A KV cache keeps the keys and values of every token the model has already read.
Each decode step reads the whole history of keys and values in every layer, then adds one new row.
The prefill reads the prompt in one pass; the decode reads one token per step.
Attention compares the query of the new token with the keys of all cached tokens.
The embedding table has one row per token id; a token id is only a row number.
Grouped-query attention lets two query heads share one key and value head, so the cache is half as large.
The residual stream is added to twice in every layer: once after attention, once after the feed-forward network.
Explain what a Transformer is. The answer is written one token at a time.
The user asks a question, the system sets the rules, and the assistant answers the user.
什么是 KV 缓存？KV 缓存保存模型已经读过的每个 token 的键和值。
解释什么是Transformer。Transformer 是一种基于注意力机制的神经网络模型。
每一步解码都要读取每一层全部历史的键和值，然后再加上一行新的。
预填充一次读完整个提示词；解码每一步只读一个 token。
注意力把新 token 的查询向量和所有缓存的键做比较。
词表里的每个 token id 只是嵌入表的行号，本身不带语义。
分组查询注意力让两个查询头共用一组键和值，因此缓存可以省一半。
每一层的残差流要加两次：注意力之后一次，前馈网络之后一次。
用户看到的每个字，都对应一轮完整的前向计算。
大模型进入生产环境，理清这些环节，比单纯记住优化名词更接近工程问题本身。
"""


def training_text(pieces: int = 20_000, seed: int = 0) -> list[str]:
    """The corpus's English lines, and its Chinese characters drawn into short random runs (seeded): Chinese has
    no spaces, so whole lines would be merged into sentence-long tokens; varied runs leave characters and
    common pairs as the merges, as in a tokenizer trained on much text."""
    import random

    lines = [line for line in CORPUS.splitlines() if line.strip() and line.isascii()]
    chinese = [ch for ch in CORPUS if "\u4e00" <= ch <= "\u9fff"]  # each as often as the corpus uses it
    draw = random.Random(seed)
    runs = ["".join(draw.choices(chinese, k=draw.randint(1, 3))) for _ in range(pieces)]
    return lines * 20 + runs


def train_tokenizer(folder: Path):
    """Train the byte-level BPE, pad it to Qwen's ids, add Qwen3's tokens and template; save into `folder`."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer

    scaffold = Qwen2Tokenizer()  # Qwen's NFC normalizer and pre-tokenizer, to train with
    bpe = Tokenizer.from_str(scaffold.backend_tokenizer.to_str())
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(training_text(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab = {token: i for token, i in model["vocab"].items() if token != "<|endoftext|>"}
    vocab = {token: i for i, token in enumerate(sorted(vocab, key=vocab.get))}
    trained = len(vocab)
    vocab.update({f"unused{i}": i for i in range(trained, REGULAR_IDS)})  # no merge reaches these
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges)
    for text, special in ADDED_TOKENS:
        tokenizer.add_tokens([AddedToken(text, special=special, normalized=False)], special_tokens=special)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer, trained


def write_model(folder: Path, trained: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> None:
    """config.json, generation_config.json and model.safetensors (random weights in `dtype`)."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen3Config

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=Q_HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=40_960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151_643,
        eos_token_id=151_645,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        dtype=dtype,
    )
    config.save_pretrained(folder)
    GenerationConfig(bos_token_id=151_643, eos_token_id=[151_645, 151_643]).save_pretrained(folder)
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * WEIGHT_STD).to(dtype)

    embed = random(VOCAB, HIDDEN)
    embed[trained:] = 0  # ids the trained BPE never produces (fillers, added tokens, padding rows)
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN, dtype=dtype)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=dtype),
                p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=dtype),
                p + "self_attn.q_proj.weight": random(Q_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.k_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": random(HIDDEN, Q_HEADS * HEAD_DIM),
                p + "self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=dtype),
                p + "self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=dtype),
                p + "mlp.gate_proj.weight": random(INTERMEDIATE, HIDDEN),
                p + "mlp.up_proj.weight": random(INTERMEDIATE, HIDDEN),
                p + "mlp.down_proj.weight": random(HIDDEN, INTERMEDIATE),
            }
        )
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def make_qwen3_shaped(folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the whole model folder; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    _, trained = train_tokenizer(folder)
    write_model(folder, trained, dtype)
    return folder
