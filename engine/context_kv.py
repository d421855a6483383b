"""One token in two contexts: its K and V in every layer (article 004 §2.2: "the weights are fixed, so why are the
K/V vectors dynamic?").

k_i = x_i W_K and v_i = x_i W_V, with the same weights for every input; x_i is what the residual stream holds at
position i when a layer reads it. At layer 0 that is the token's embedding row alone (with RoPE the position enters
inside attention), so the key before rotation and the value are the same in any context; the rotation then turns
the key by its position. From layer 1 on, x_i carries what attention gathered from the positions before i (never
after: the mask is causal), so K and V differ in content.

    both = token_in_contexts(model, ids_a, index_a, ids_b, index_b)
    both.key_cosines()     # per layer, the keys as cached (rotated)
    both.value_cosines()   # per layer
    both.unrotated_key_cosines()  # per layer, the keys turned back by their own position (RoPE models)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.errors import InvalidSettingError
from engine.kv_cache import DEFAULT_BLOCK_SIZE, BlockTable
from engine.model import Model
from engine.rope import apply_rope
from engine.trace import NO_RECORD


@dataclass
class TokenInContexts:
    """One token's cached K and V in every layer, in two contexts: (layers, kv_heads, head_dim) float32 each."""

    token_id: int
    positions: tuple[int, int]
    keys: tuple[torch.Tensor, torch.Tensor]  # as the cache holds them: after k_norm and RoPE
    values: tuple[torch.Tensor, torch.Tensor]
    unrotated_keys: tuple[torch.Tensor, torch.Tensor] | None  # turned back by their position; None without RoPE

    def key_cosines(self) -> list[float]:
        return _cosines(*self.keys)

    def value_cosines(self) -> list[float]:
        return _cosines(*self.values)

    def unrotated_key_cosines(self) -> list[float] | None:
        return None if self.unrotated_keys is None else _cosines(*self.unrotated_keys)

    @property
    def nbytes(self) -> int:
        held = [*self.keys, *self.values, *(self.unrotated_keys or ())]
        return sum(t.nbytes for t in held)

    def largest_difference(self, which: str, layer: int) -> float:
        """The largest |a − b| between the two contexts' `which` ("keys", "values", "unrotated_keys") at `layer`."""
        a, b = getattr(self, which)
        return float((a[layer] - b[layer]).abs().max())


def token_in_contexts(
    model: Model, first_ids: list[int], first_index: int, second_ids: list[int], second_index: int
) -> TokenInContexts:
    """Prefill each sequence in a cache of its own and read the K and V its token (`ids[index]`, the same id in
    both) left in every layer. Only the positions up to the token are computed: nothing after it can change them."""
    for ids, index in ((first_ids, first_index), (second_ids, second_index)):
        if not 0 <= index < len(ids):
            raise InvalidSettingError(f"the token's index {index} is outside its {len(ids)}-token context")
    if first_ids[first_index] != second_ids[second_index]:
        raise InvalidSettingError(
            f"the two contexts hold different ids there: {first_ids[first_index]} and {second_ids[second_index]}"
        )
    first = _cached_kv(model, first_ids[: first_index + 1])
    second = _cached_kv(model, second_ids[: second_index + 1])
    unrotated = None
    if model.ropes:
        unrotated = (_unrotate(model, first[0], first_index), _unrotate(model, second[0], second_index))
    return TokenInContexts(
        first_ids[first_index], (first_index, second_index), (first[0], second[0]), (first[1], second[1]), unrotated
    )


def _cached_kv(model: Model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The last position's K and V in every layer after a prefill of `ids`: (layers, kv_heads, head_dim) each."""
    n = len(ids)
    table = BlockTable(model.new_pool(math.ceil(n / DEFAULT_BLOCK_SIZE), DEFAULT_BLOCK_SIZE))
    table.append(n)
    model.forward(ids, list(range(n)), table, NO_RECORD, head=False)
    keys, values = [], []
    for layer in range(model.info.layers):
        k, v, start = table.read(layer)
        keys.append(k[n - 1 - start].float())
        values.append(v[n - 1 - start].float())
    table.free()
    return torch.stack(keys), torch.stack(values)


def _unrotate(model: Model, keys: torch.Tensor, position: int) -> torch.Tensor:
    """Keys (layers, kv_heads, D) rotated at `position` turned back (RoPE's rotation by −angle; a scaled RoPE's cos
    and sin carry its scale, twice over after the round trip)."""
    out = []
    for layer, kind in enumerate(model.info.layer_kinds):
        rope = model.ropes[kind]
        cos, sin = rope.cos_sin(torch.tensor([position]), torch.float32)
        out.append(apply_rope(keys[layer][None], cos, -sin)[0] / rope.attention_scaling**2)
    return torch.stack(out)


def _cosines(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Per layer, the cosine between a[layer] and b[layer], each KV head's vector laid end to end."""
    return torch.nn.functional.cosine_similarity(a.flatten(1).double(), b.flatten(1).double(), dim=1).tolist()
