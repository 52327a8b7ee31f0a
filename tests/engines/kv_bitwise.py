#!/usr/bin/env python3
"""KV pages between two processes on one GPU, bit for bit, through xinf_kv's extension module
(what the vLLM connector and the SGLang backend call), with caches allocated on the GPU by
torch exactly as vLLM 0.26 and SGLang 0.5.15 allocate them.

Opt-in (XINF_TEST_ENGINES=1 or XINF_TEST_GPU=1; needs a GPU, torch and a `cuda` build of
xinf_kv). For each direction — vLLM's paged-packed cache (NHD, blocks of 16) → SGLang's token
pool, and SGLang's pool → vLLM's cache (all but the last token, as vLLM's decode imports) — at
65, 129 and 193 tokens: a prefill process fills its cache with random bits and publishes a
room (``PageHost.publish``, gathered into GPU staging; vLLM's cache on the stream that wrote
it, which then overwrites it at once), this process loads it into its own
cache (``PageLoader``, CUDA IPC) and compares every written slot with the source and every
other slot with what was there; the counters must show GPU bytes moved and no host copy.

usage: OUT=<dir> kv_bitwise.py
"""

import json
import multiprocessing as mp
import os
import sys

if os.environ.get("XINF_TEST_ENGINES") != "1" and os.environ.get("XINF_TEST_GPU") != "1":
    print("SKIPPED: set XINF_TEST_ENGINES=1 (needs a GPU, torch and xinf_kv built with cuda)", file=sys.stderr)
    sys.exit(0)

L, H, D, B = 24, 2, 64, 16  # Qwen2.5-0.5B's KV shape
OUT = os.environ.get("OUT", "/tmp/kv-bitwise")


def vllm_caches(torch, nb, gen):
    """vLLM 0.26: per layer ``(blocks, H, B, 2D)`` over NHD memory ``(blocks, B, H, 2D)``."""
    out = []
    for _ in range(L):
        phys = torch.randint(-(1 << 15), 1 << 15, (nb, B, H, 2 * D), dtype=torch.int16, device="cuda", generator=gen)
        out.append(phys.view(torch.float16).permute(0, 2, 1, 3))
    return out


def sglang_pools(torch, slots, gen):
    """SGLang 0.5.15: per layer a K and a V buffer of ``(slots, H, D)``."""
    def buf():
        return torch.randint(-(1 << 15), 1 << 15, (slots, H, D), dtype=torch.int16, device="cuda", generator=gen).view(torch.float16)

    return [(buf(), buf()) for _ in range(L)]


def same(a, b):
    """Bit for bit (random bits hold NaNs, which compare unequal as numbers)."""
    import torch

    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def token_kv_vllm(torch, caches, table, n):
    """``(n, L, 2, H, D)`` int16: each token's K and V, by indexing."""
    t = torch.arange(n, device="cuda")
    blk, off = torch.tensor(table, device="cuda")[t // B], t % B
    per_layer = [c[blk, :, off].view(torch.int16) for c in caches]  # (n, H, 2D)
    return torch.stack([torch.stack([x[..., :D], x[..., D:]], 1) for x in per_layer], 1).cpu()


def token_kv_pool(torch, pools, slots):
    s = torch.tensor(slots, device="cuda")
    return torch.stack([torch.stack([k[s].view(torch.int16), v[s].view(torch.int16)], 1) for k, v in pools], 1).cpu()


def prefill(conn):
    """The prefill process: fill a cache, publish rooms on request, answer with the source bits."""
    import torch

    from xinf_kv import _native, vllm_layout

    torch.cuda.set_device(0)
    host = _native.PageHost("127.0.0.1", 0)
    gen = torch.Generator(device="cuda").manual_seed(11)
    keep = []
    while True:
        msg = conn.recv()
        if msg is None:
            conn.send(dict(host.stats()))
            return
        kind, n, room = msg
        if kind == "vllm":
            nb = -(-n // B) + 7
            caches = vllm_caches(torch, nb, gen)
            table = torch.randperm(nb - 1, generator=torch.Generator().manual_seed(n))[: -(-n // B)].add(1).tolist()
            layout = _native.Layout(**vllm_layout.describe(caches))
            # As vLLM's connector publishes: on the stream the forward writes the KV on and
            # later steps reuse the blocks on, with no host wait. The "forward" here comes late
            # (behind a spin) and the blocks are overwritten right after the publish, so the
            # room holds these bits only if the gather was ordered between the two.
            kv = vllm_caches(torch, nb, gen)
            ref = token_kv_vllm(torch, kv, table, n)
            torch.cuda._sleep(20_000_000)
            for c, k in zip(caches, kv):
                c.copy_(k)
            stream = torch.cuda.current_stream().cuda_stream
            host.publish(room, layout, [vllm_layout.address(c) for c in caches], table, n, 60_000, stream=stream)
            for c in caches:
                c.zero_()
        else:
            pools = sglang_pools(torch, n + 50, gen)
            slots = torch.randperm(n + 49, generator=torch.Generator().manual_seed(n))[:n].add(1).tolist()
            layout = _native.Layout("token-pool", 1, L, H, D, n + 50, 2)
            regions = [vllm_layout.address(x) for k, v in pools for x in (k, v)]
            host.publish(room, layout, regions, slots, n, 60_000)
            ref = token_kv_pool(torch, pools, slots)
            caches = pools
        keep.append(caches)
        conn.send((host.endpoint, host.kv_device, ref.numpy().tobytes()))


def main():
    import numpy as np
    import torch

    from xinf_kv import _native, vllm_layout

    os.makedirs(OUT, exist_ok=True)
    torch.cuda.set_device(0)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=prefill, args=(there,))
    p.start()
    loader = _native.PageLoader(0)
    gen = torch.Generator(device="cuda").manual_seed(23)
    results = []

    def check(name, ok, detail=""):
        results.append({"check": name, "ok": bool(ok), "detail": str(detail)[:300]})
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)

    room = 100
    for n in (65, 129, 193):
        # vLLM prefill → SGLang decode: every prompt token into the slots SGLang reserved.
        room += 1
        here.send(("vllm", n, room))
        endpoint, device, ref = here.recv()
        ref = np.frombuffer(ref, np.int16).reshape(n, L, 2, H, D)
        pools = sglang_pools(torch, n + 300, gen)
        before = [(k.clone(), v.clone()) for k, v in pools]
        slots = torch.randperm(n + 299, generator=torch.Generator().manual_seed(99 + n))[:n].add(1).tolist()
        layout = _native.Layout("token-pool", 1, L, H, D, n + 300, 2)
        regions = [vllm_layout.address(x) for k, v in pools for x in (k, v)]
        loader.start(f"vs{n}", endpoint, room, device, layout, regions, slots, (0, n))
        done = loader.wait(30.0)
        got = token_kv_pool(torch, pools, slots).numpy()
        mask = torch.ones(n + 300, dtype=torch.bool)
        mask[slots] = False
        m = mask.cuda()
        untouched = all(same(a[m], b[m]) for (k, v), (bk, bv) in zip(pools, before) for a, b in ((k, bk), (v, bv)))
        check(f"vLLM → SGLang {n}: every token's K and V bit for bit", done == [(f"vs{n}", None)] and got.tobytes() == ref.tobytes(), done)
        check(f"vLLM → SGLang {n}: every other slot untouched", untouched)

        # SGLang prefill → vLLM decode: all but the last token (vLLM recomputes it).
        room += 1
        here.send(("sglang", n, room))
        endpoint, device, ref = here.recv()
        ref = np.frombuffer(ref, np.int16).reshape(n, L, 2, H, D)
        nb = -(-n // B) + 9
        caches = vllm_caches(torch, nb, gen)
        before = [c.clone() for c in caches]
        table = list(range(3, 3 + -(-n // B)))
        layout = _native.Layout(**vllm_layout.describe(caches))
        loader.start(f"sv{n}", endpoint, room, device, layout, [vllm_layout.address(c) for c in caches], table, (0, n - 1))
        done = loader.wait(30.0)
        got = token_kv_vllm(torch, caches, table, n).numpy()
        last_same = all(same(c[table[(n - 1) // B], :, (n - 1) % B], b[table[(n - 1) // B], :, (n - 1) % B]) for c, b in zip(caches, before))
        others = [i for i in range(nb) if i not in table]
        blocks_same = all(same(c[others], b[others]) for c, b in zip(caches, before))
        check(f"SGLang → vLLM {n}: tokens 0..{n - 1} bit for bit", done == [(f"sv{n}", None)] and got[: n - 1].tobytes() == ref[: n - 1].tobytes(), done)
        check(f"SGLang → vLLM {n}: the last token and the other blocks untouched", last_same and blocks_same)

    here.send(None)
    host_stats = here.recv()
    p.join(30)
    load_stats = dict(loader.stats())
    check("the pages moved GPU to GPU", load_stats["device_bytes_in"] > 0 and host_stats["device_bytes_out"] == load_stats["device_bytes_in"], (load_stats, host_stats))
    check("no page went through host memory", load_stats["host_bytes_in"] == 0 and host_stats["host_bytes_out"] == 0, (load_stats, host_stats))
    json.dump({"results": results, "loader": load_stats, "host": host_stats}, open(os.path.join(OUT, "kv_bitwise.json"), "w"), indent=1)
    fails = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(fails)}/{len(results)} passed; loader {load_stats}; host {host_stats}", flush=True)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
