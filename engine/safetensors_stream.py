"""Write a safetensors file a tensor at a time: the header first, then each tensor's bytes appended.

The model converters use it so that their peak is one tensor, never a whole model: every name, shape and
dtype is known before any value is computed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}


def write_streamed(
    target: Path, shapes: dict[str, list[int]], dtype: torch.dtype, values: Callable[[str], Iterable[torch.Tensor]]
) -> None:
    """`shapes` (name → shape) in one file of `dtype`; `values(name)` yields that tensor's elements as
    consecutive flat chunks already in `dtype`. ValueError when a tensor's chunks do not fill its shape."""
    size = torch.finfo(dtype).bits // 8
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = _count(shape) * size
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(target, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for name in shapes:
            written = 0
            for chunk in values(name):
                if chunk.dtype != dtype:
                    raise ValueError(f"{name}: a {chunk.dtype} chunk in a {dtype} file")
                out.write(chunk.contiguous().view(torch.uint8).numpy().data)
                written += chunk.numel() * size
            start, end = header[name]["data_offsets"]
            if written != end - start:
                raise ValueError(f"{name}: {written} bytes written, {end - start} expected")


def rounded_chunks(tensor: torch.Tensor, dtype: torch.dtype, rows: int = 4096) -> Iterator[torch.Tensor]:
    """`tensor` cast to `dtype` (round to nearest even, as `Tensor.to`), a few thousand rows at a time."""
    flat = tensor.reshape(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.reshape(1, -1)
    for start in range(0, flat.shape[0], rows):
        yield flat[start : start + rows].to(dtype).reshape(-1)


def _count(shape: list[int]) -> int:
    count = 1
    for n in shape:
        count *= int(n)
    return count
