"""Shared fixtures: tiny random-weight models of each family, saved like any model folder.

Nothing here touches the network: HF_HUB_OFFLINE is set before transformers is imported, and every
tiny model uses the embedded SmolLM2 tokenizer (read from the GGUF package) saved beside its weights.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one thread each (the app computes with one too)
    torch.set_num_threads(1)

import engine  # noqa: E402
from engine import embedded  # noqa: E402
from engine.loader import AUTO  # noqa: E402

HIDDEN, LAYERS, CONTEXT = 64, 2, 256
GEMMA_WINDOW = 8  # shorter than every test prompt: the local layers' window slides during the prefill


def family_config(family: str, vocab: int):
    """A tiny config per family; each variant exercises one feature the engine must get right."""
    from transformers import Gemma3TextConfig, GPT2Config, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "llama":  # GQA: 4 Q heads share 2 KV heads
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "llama-long":  # a longer context, for long runs
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **{**common, "max_position_embeddings": 1024})
    if family == "llama3-rope":  # RoPE scaled as Llama 3.x / SmolLM do, tied embeddings
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        return LlamaConfig(
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_parameters=rope,
            **{**common, "tie_word_embeddings": True},
        )
    if family == "qwen2":  # q/k/v biases
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "qwen3":  # q_norm/k_norm, and 4 heads × 32 = 128 ≠ hidden 64, as Qwen3-0.6B's 2048 ≠ 1024
        return Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=32, **common)
    if family == "gpt2":  # LayerNorm, learned positions, Conv1D weights, MHA
        return GPT2Config(
            vocab_size=vocab,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=4,
            n_positions=CONTEXT,
            bos_token_id=1,
            eos_token_id=2,
        )
    if family == "gemma3":  # local and global layers, each with its RoPE (global scaled), sandwich norms, GeGLU,
        # a query scale that is not 1/√head_dim, GQA 4:1, tied embeddings and a final logit cap
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 2.0},
        }
        layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        return Gemma3TextConfig(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=GEMMA_WINDOW,
            layer_types=layer_types,
            rope_parameters=rope,
            final_logit_softcapping=30.0,
            pad_token_id=0,
            **{**common, "num_hidden_layers": len(layer_types), "tie_word_embeddings": True},
        )
    raise ValueError(family)


FAMILIES = ["llama", "llama3-rope", "qwen2", "qwen3", "gpt2", "gemma3"]


@pytest.fixture(scope="session")
def embedded_folder() -> str:
    return embedded.embedded_source()


@pytest.fixture(scope="session")
def tokenizer(embedded_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_folder)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """family → folder with a random-weight model (seeded) and the SmolLM2 tokenizer."""
    from transformers import AutoModelForCausalLM

    made: dict[str, str] = {}

    def make(family: str) -> str:
        if family not in made:
            torch.manual_seed(1234)
            model = AutoModelForCausalLM.from_config(family_config(family, len(tokenizer)))
            if family == "gemma3":  # Gemma's norms start at 0 (a scale of 1 + 0): random ones test the 1 +
                with torch.no_grad():
                    for name, weight in model.named_parameters():
                        if "norm" in name:
                            weight.normal_(0.0, 0.3)
            folder = tmp_path_factory.mktemp(family)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            made[family] = str(folder)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    loaded: dict[str, engine.Model] = {}

    def load(family: str) -> engine.Model:
        if family not in loaded:
            loaded[family] = engine.load_model(tiny_model_dir(family), device="cpu")
        return loaded[family]

    return load


@pytest.fixture(scope="session")
def embedded_model(embedded_folder) -> engine.Model:
    """SmolLM2 (`embedded`) as the app holds it by default (float32: `engine.loader.EMBEDDED_DTYPES`)."""
    return engine.load_model("embedded", device="cpu", dtype=AUTO)


@pytest.fixture(scope="session")
def embedded_zh_model() -> engine.Model:
    """Gemma 3 270M (`embedded-zh`) as the app holds it by default (bfloat16): the model a page in Chinese opens on."""
    return engine.load_model(embedded.ZH, device="cpu", dtype=AUTO)


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium, one for the whole session of each xdist worker: each test gets a context of its own
    (`page`)."""
    from playwright.sync_api import expect

    from tests.helpers import WAIT_MS
    from tests.server import chromium

    # A page's draw on a loaded 2-core machine (or a slower CI one) can take longer than Playwright's default 5 s: an
    # assertion waits as long as any one wait may (tests/helpers.py's WAIT_MS). How soon a page draws is measured by
    # bench/browser_latency.py, not here.
    expect.set_options(timeout=WAIT_MS)
    with chromium() as browser:
        yield browser


@pytest.fixture
def pages(browser):
    """Three pages, each in a fresh browser context (its own session) at 1280×720: a class in one browser."""
    contexts = [browser.new_context(viewport={"width": 1280, "height": 720}) for _ in range(3)]
    yield [context.new_page() for context in contexts]
    for context in contexts:
        context.close()


@pytest.fixture
def page(request, browser):
    """A page in a fresh browser context (its own cookies, so its own Streamlit session), 1280×720 unless the
    module's `PAGE` says otherwise (width, height and other `new_context` options)."""
    options = {"width": 1280, "height": 720, **getattr(request.module, "PAGE", {})}
    width, height = options.pop("width"), options.pop("height")
    context = browser.new_context(viewport={"width": width, "height": height}, **options)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """The app on a real Streamlit server on loopback, one for the whole session of each xdist worker (each model
    loads once, at the first page that needs it): (url, process, log path). A test that needs a fresh server or
    other settings starts its own (tests/server.py's `running_server`)."""
    from tests.server import running_server

    log_path = tmp_path_factory.mktemp("server") / "log.txt"
    with running_server(log_path) as (url, process):
        yield url, process, log_path


@pytest.fixture(scope="session")
def server(app_server) -> str:
    """The session's server's URL."""
    return app_server[0]


@pytest.fixture(scope="session")
def qwen3_shaped_dir(tmp_path_factory) -> str:
    """A folder with a random-weight model of Qwen3-0.6B's exact shape, in bfloat16, and a tokenizer trained
    here (tests/qwen3_shaped.py): 1.19 GB on disk, ~10 s to write."""
    from tests.qwen3_shaped import make_qwen3_shaped

    return str(make_qwen3_shaped(tmp_path_factory.mktemp("qwen3-0.6b-shaped")))


QWEN3_SHAPED_DTYPE = torch.bfloat16  # as the app holds it (KVSCOPE_DTYPE=auto: it is saved in bfloat16)


@pytest.fixture(scope="session")
def qwen3_shaped(qwen3_shaped_dir) -> engine.Model:
    return engine.load_model(qwen3_shaped_dir, device="cpu", dtype=QWEN3_SHAPED_DTYPE)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free loopback port, nothing saved to disk; its URL. Stopped after the session."""
    from tests.redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(params=["memory", "redis"])
def store(request):
    """Each room store in turn: the in-process one and a real redis-server, emptied first."""
    import redis

    from ui.follow.store import MemoryStore, RedisStore

    if request.param == "memory":
        return MemoryStore()
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushdb()
    return RedisStore(url)


# Fixtures made once per worker that asks for them, each costly: a module's own servers (a server start and its
# model loads), a model or a read of a GGUF, the Qwen3-shaped folder (1.19 GB written). The tests that share one go
# to one worker together, so it is made once.
ONE_WORKER = (
    "qwen3_shaped_dir",
    "deployment",
    "fresh_server",
    "small_open_host",
    "gguf_read",
    "zh_model",
    "bf16_zh",
    "long_run",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """pytest-xdist's two workers (pytest.ini: `-n 2 --dist loadgroup`) take the tests one by one, each worker
    with its own session fixtures (its own server and Chromium): most of a browser test's time is spent waiting on
    its page or its server, and an AppTest computes with one thread, so two workers keep both cores busy. The
    tests sharing one of the `ONE_WORKER` fixtures go to one worker together."""
    for item in items:
        shared = next((name for name in ONE_WORKER if name in item.fixturenames), None)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(shared))
