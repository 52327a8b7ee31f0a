"""Pages between xinf's page plane and KV caches laid out as vLLM 0.26 and SGLang 0.5.15 lay
them out, bit for bit, through the extension module (real page servers on loopback)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import reference_pages_pool, reference_pages_vllm, sglang_pool, vllm_cache
from xinf_kv import vllm_layout

LENGTHS = [1, 63, 64, 65, 129, 193]
L, H, D, B = 3, 2, 64, 16


def vllm_layout_of(native, caches):
    return native.Layout(**vllm_layout.describe(caches))


def pool_layout(native, slots):
    return native.Layout("token-pool", 1, L, H, D, slots, 2)


def pool_regions(pools):
    return [vllm_layout.address(x) for k, v in pools for x in (k, v)]


@pytest.mark.parametrize("order", ["NHD", "HND"])
@pytest.mark.parametrize("length", LENGTHS)
def test_gather_from_vllm_matches_indexing(native, rng, order, length):
    nb = -(-length // B) + 5
    caches = [vllm_cache(nb, H, B, D, order, rng) for _ in range(L)]
    layout = vllm_layout_of(native, caches)
    assert vllm_layout.describe(caches)["order"] == order
    import conftest

    if conftest.torch is not None:  # the torch tensors themselves describe the same layout
        tensors = conftest._KEEP[-L:]
        assert vllm_layout.describe(tensors) == vllm_layout.describe(caches)
        assert [vllm_layout.address(t) for t in tensors] == [vllm_layout.address(c) for c in caches]
    table = list(rng.permutation(np.arange(1, nb))[: -(-length // B)])
    pages = -(-length // 64)
    got = native.gather_host(layout, [vllm_layout.address(c) for c in caches], table, (0, length), 0, pages)
    want = reference_pages_vllm(caches, table, length, B)
    assert np.frombuffer(got, dtype=np.uint16).reshape(want.shape).tobytes() == want.tobytes()
    assert len(got) == pages * layout.page_bytes


@pytest.mark.parametrize("length", LENGTHS)
def test_gather_from_sglang_matches_indexing(native, rng, length):
    slots_total = length + 40
    pools = [sglang_pool(slots_total, H, D, rng) for _ in range(L)]
    slots = list(rng.permutation(np.arange(1, slots_total))[:length])
    got = native.gather_host(pool_layout(native, slots_total), pool_regions(pools), slots, (0, length), 0, -(-length // 64))
    assert got == reference_pages_pool(pools, slots, length).tobytes()


@pytest.mark.parametrize("full", [False, True], ids=["minimal", "full"])
@pytest.mark.parametrize("length", LENGTHS)
def test_vllm_to_sglang_over_the_page_plane_bit_for_bit(native, rng, length, full):
    """vLLM prefill → SGLang decode: gather, publish a room, load it over TCP into the pool;
    every other slot of the pool stays as it was."""
    nb = -(-length // B) + 1 + (50 if full else 0)
    caches = [vllm_cache(nb, H, B, D, "NHD", rng) for _ in range(L)]
    table = list(rng.permutation(np.arange(1, nb))[: -(-length // B)])
    host = native.PageHost()
    room = int(rng.integers(1, 1 << 62))
    pages = host.publish(room, vllm_layout_of(native, caches), [vllm_layout.address(c) for c in caches], table, length, 10_000)
    assert pages == -(-length // 64)
    slots_total = length + 1 + (500 if full else 0)
    pools = [sglang_pool(slots_total, H, D, rng) for _ in range(L)]
    before = [(k.copy(), v.copy()) for k, v in pools]
    slots = list(rng.permutation(np.arange(1, slots_total))[:length])
    loader = native.PageLoader()
    loader.start("r1", host.endpoint, room, None, pool_layout(native, slots_total), pool_regions(pools), slots, (0, length))
    assert loader.wait(10.0) == [("r1", None)]
    for l in range(L):
        for kv in range(2):
            src = caches[l][:, :, :, kv * D : (kv + 1) * D]
            dst, old = pools[l][kv], before[l][kv]
            for t in range(length):
                assert dst[slots[t]].tobytes() == src[table[t // B], :, t % B].tobytes()
            untouched = np.setdiff1d(np.arange(slots_total), slots)
            assert dst[untouched].tobytes() == old[untouched].tobytes()
    stats = host.stats()
    assert stats["host_bytes_out"] == pages * vllm_layout_of(native, caches).page_bytes
    assert loader.stats()["host_bytes_in"] == stats["host_bytes_out"]
    assert host.release(room) and not host.release(room)


@pytest.mark.parametrize("length", [65, 129, 193])
def test_sglang_to_vllm_leaves_the_local_prefix_and_the_last_token(native, rng, length):
    """SGLang prefill → vLLM decode: vLLM imports ``N - 1`` tokens (it recomputes the last)
    after a local prefix hit of one block: tokens below 16 and token N-1 are not written."""
    slots_total = length + 3
    pools = [sglang_pool(slots_total, H, D, rng) for _ in range(L)]
    slots = list(rng.permutation(np.arange(1, slots_total))[:length])
    src_layout = pool_layout(native, slots_total)
    pages = native.gather_host(src_layout, pool_regions(pools), slots, (0, length), 0, -(-length // 64))
    host = native.PageHost()
    host.publish_pages(5, src_layout.page_bytes, pages, 10_000)
    nb = -(-length // B) + 4
    caches = [vllm_cache(nb, H, B, D, "HND", rng) for _ in range(L)]
    before = [c.copy() for c in caches]
    table = list(range(1, 1 + -(-length // B)))
    start, end = B, length - 1
    loader = native.PageLoader()
    layout = vllm_layout_of(native, caches)
    loader.start("d", host.endpoint, 5, None, layout, [vllm_layout.address(c) for c in caches], table, (start, end))
    assert loader.wait(10.0) == [("d", None)]
    for l in range(L):
        for t in range(length):
            blk, off = table[t // B], t % B
            got = caches[l][blk, :, off]
            if start <= t < end:
                assert got[:, :D].tobytes() == pools[l][0][slots[t]].tobytes()
                assert got[:, D:].tobytes() == pools[l][1][slots[t]].tobytes()
            else:
                assert got.tobytes() == before[l][blk, :, off].tobytes()
        unused = [b for b in range(nb) if b not in table]
        assert caches[l][unused].tobytes() == before[l][unused].tobytes()


def test_a_page_past_the_prompt_is_zero(native, rng):
    caches = [vllm_cache(8, H, B, D, "NHD", rng) for _ in range(L)]
    got = native.gather_host(vllm_layout_of(native, caches), [vllm_layout.address(c) for c in caches], [1, 2, 3, 4, 5], (0, 65), 0, 2)
    page = np.frombuffer(got, dtype=np.uint16).reshape(2, L, 2, 64, H, D)
    assert not page[1, :, :, 1:].any()
    assert page[1, :, :, 0].any()


def test_bad_arguments_are_refused_with_the_reason(native, rng):
    caches = [vllm_cache(4, H, B, D, "NHD", rng) for _ in range(L)]
    layout = vllm_layout_of(native, caches)
    regions = [vllm_layout.address(c) for c in caches]
    with pytest.raises(ValueError, match="block 9 of a cache of 4 blocks"):
        native.gather_host(layout, regions, [9], (0, 10), 0, 1)
    with pytest.raises(ValueError, match="a block table of 1 blocks for 40 tokens"):
        native.gather_host(layout, regions, [1], (0, 40), 0, 1)
    with pytest.raises(ValueError, match="2 region addresses for a layout of 3 regions"):
        native.gather_host(layout, regions[:2], [1], (0, 10), 0, 1)
    with pytest.raises(ValueError, match="overlap"):
        native.gather_host(layout, [regions[0]] * 3, [1], (0, 10), 0, 1)
    with pytest.raises(ValueError, match="unknown kv_layout"):
        native.Layout("paged-sideways", 16, 1, 1, 64, 4, 2)
    with pytest.raises(ValueError, match="block_size 8 is not allowed"):
        native.Layout("paged-packed", 8, 1, 1, 64, 4, 2)
    with pytest.raises(ValueError, match="strides"):
        vllm_layout.describe([np.zeros((4, 2, 16, 128), dtype=np.uint16).transpose(0, 1, 3, 2).reshape(4, 2, 16, 128)[:, ::-1]])
