"""Shared fixtures: engine KV caches laid out exactly as vLLM 0.26 and SGLang 0.5.15 lay them
out, allocated with torch the way the engines allocate them (CPU tensors), and handed to the
tests as numpy views of the same memory for indexing. Where torch is not installed numpy
builds the same bytes and strides, and says so."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip("xinf_kv._native", reason="the extension module is not built (maturin develop)")

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    import warnings

    warnings.warn("torch is not installed: the engine caches are built with numpy instead", stacklevel=1)

#: The torch tensors behind the numpy views handed out, kept alive for the test's length.
_KEEP: list = []


def _f16_view(t) -> np.ndarray:
    """A numpy view of a float16 torch tensor's memory, as raw uint16 bits (same strides)."""
    _KEEP.append(t)
    return t.numpy().view(np.uint16)


def vllm_cache(num_blocks: int, kv_heads: int, block_size: int, head_dim: int, order: str, rng) -> np.ndarray:
    """One layer of vLLM 0.26's cache: ``torch.zeros(bytes, int8).view(dtype).view(physical)
    .permute(inverse order)``, logical ``(blocks, H, B, 2D)``, physical NHD ``(blocks, B, H, 2D)``
    or HND ``(blocks, H, B, 2D)`` (``vllm/v1/worker/gpu/attn_utils.py``), filled with random
    half-precision bit patterns."""
    n = num_blocks * kv_heads * block_size * 2 * head_dim
    physical = (num_blocks, block_size, kv_heads, 2 * head_dim) if order == "NHD" else (num_blocks, kv_heads, block_size, 2 * head_dim)
    inverse = (0, 2, 1, 3) if order == "NHD" else (0, 1, 2, 3)
    if torch is not None:
        t = torch.zeros(n * 2, dtype=torch.int8).view(torch.float16).view(physical).permute(*inverse)
        assert tuple(t.shape) == (num_blocks, kv_heads, block_size, 2 * head_dim)
        arr = _f16_view(t)
    else:
        arr = np.zeros(n * 2, dtype=np.int8).view(np.uint16).reshape(physical).transpose(inverse)
    arr[...] = rng.integers(0, 1 << 16, size=arr.shape, dtype=np.uint16)
    return arr


def sglang_pool(slots: int, kv_heads: int, head_dim: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """One layer of SGLang 0.5.15's ``MHATokenToKVPool``: separate K and V buffers of
    ``(size + page_size, H, D)`` (``sglang/srt/mem_cache/memory_pool.py``)."""
    out = []
    for _ in range(2):
        if torch is not None:
            a = _f16_view(torch.zeros((slots, kv_heads, head_dim), dtype=torch.float16))
        else:
            a = np.zeros((slots, kv_heads, head_dim), dtype=np.uint16)
        a[...] = rng.integers(0, 1 << 16, size=a.shape, dtype=np.uint16)
        out.append(a)
    return out[0], out[1]


def reference_pages_vllm(caches, block_table, length, block_size):
    """Canonical pages ``[pages][layers][K,V][64][H][D]`` of a sequence in vLLM caches, by
    indexing (no xinf code)."""
    layers = len(caches)
    _, h, _, two_d = caches[0].shape
    d = two_d // 2
    pages = -(-length // 64)
    out = np.zeros((pages, layers, 2, 64, h, d), dtype=np.uint16)
    for t in range(length):
        blk, off = block_table[t // block_size], t % block_size
        for l, c in enumerate(caches):
            out[t // 64, l, 0, t % 64] = c[blk, :, off, :d]
            out[t // 64, l, 1, t % 64] = c[blk, :, off, d:]
    return out


def reference_pages_pool(pools, slots, length):
    """Canonical pages of a sequence in SGLang pools (``slots[t]`` = token t's slot)."""
    layers = len(pools)
    h, d = pools[0][0].shape[1:]
    pages = -(-length // 64)
    out = np.zeros((pages, layers, 2, 64, h, d), dtype=np.uint16)
    for t in range(length):
        for l, (k, v) in enumerate(pools):
            out[t // 64, l, 0, t % 64] = k[slots[t]]
            out[t // 64, l, 1, t % 64] = v[slots[t]]
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture
def native():
    return _native
