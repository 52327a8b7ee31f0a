"""vLLM 0.26's KV tensors as an xinf layout.

vLLM hands the connector one tensor per attention layer, logical shape
``(num_blocks, kv_heads, block_size, 2 * head_dim)``: K and V packed in each head's last axis,
K first. Physically it is block → token → head → K|V in NHD (strides
``(B·H·2D, 2D, H·2D, 1)``, the default) and block → head → token → K|V in HND (strides
``(H·B·2D, B·2D, 2D, 1)``). That is xinf's ``paged-packed`` layout, one region per layer.
"""

from __future__ import annotations

import re
from typing import Any

_LAYER = re.compile(r"(\d+)")


def layer_order(names: list[str]) -> list[str]:
    """Layer names in layer order (by the first number in each name, e.g.
    ``model.layers.11.self_attn.attn``), the order xinf's pages hold layers in."""

    def key(name: str) -> tuple[int, str]:
        m = _LAYER.search(name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(names, key=key)


def describe(tensors: list[Any]) -> dict:
    """The layout arguments of ``xinf_kv._native.Layout`` for vLLM's per-layer KV tensors, or
    ``ValueError`` naming what does not fit. Works for torch tensors and for numpy arrays
    (strides in bytes there)."""
    if not tensors:
        raise ValueError("no KV tensors")
    first = tensors[0]
    shape = tuple(first.shape)
    if len(shape) != 4 or shape[3] % 2:
        raise ValueError(f"a KV tensor of shape {shape} (expected (blocks, kv_heads, block_size, 2*head_dim))")
    nb, h, b, two_d = shape
    d = two_d // 2
    elem = _elem_bytes(first)
    strides = _strides(first, elem)
    nhd = (b * h * two_d, two_d, h * two_d, 1)
    hnd = (h * b * two_d, b * two_d, two_d, 1)
    if strides == nhd:
        order = "NHD"
    elif strides == hnd:
        order = "HND"
    else:
        raise ValueError(f"KV tensor strides {strides} are neither NHD {nhd} nor HND {hnd}")
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape or _strides(t, elem) != strides or _elem_bytes(t) != elem:
            raise ValueError(f"KV tensor {i} differs from the first in shape, strides or dtype")
    return {
        "kind": "paged-packed",
        "block_size": b,
        "layers": len(tensors),
        "kv_heads": h,
        "head_dim": d,
        "num_blocks": nb,
        "elem_bytes": elem,
        "order": order,
    }


def address(t: Any) -> int:
    """The tensor's base address (torch ``data_ptr()``, numpy ``ctypes.data``)."""
    if hasattr(t, "data_ptr"):
        return int(t.data_ptr())
    return int(t.ctypes.data)


def _elem_bytes(t: Any) -> int:
    if hasattr(t, "element_size"):
        return int(t.element_size())
    return int(t.itemsize)


def _strides(t: Any, elem: int) -> tuple[int, ...]:
    s = t.stride() if callable(getattr(t, "stride", None)) else tuple(x // elem for x in t.strides)
    return tuple(int(x) for x in s)
