"""Check and time versions of the native engine's prefill attention kernel (`flash_prefill`).

A version is the source the engine appends to its other kernels for the prefill attention:
`engines/native/src/gpu/flash.cu` (the `mma.sync` kernel, sm_80 on), then `flash_sm90.cu` (the
`wgmma` kernel that takes its place on sm_90 for heads of 64 and 128), or a copy of either. It
is named as files joined by `+`, read in that order; an element `-DNAME` or `-DNAME=VALUE` puts
`#define NAME VALUE` before them. The kernel is compiled with NVRTC as the engine assembles it
(the defines, `kernels.cu`, `gemv.cu`, then the version; sm_90 as sm_90a), run on a paged KV
cache of random values laid out as the native engine's default (`paged-kv-first`, NHD, 16-token
blocks, blocks in shuffled order), checked against PyTorch's attention in float32, and timed with
CUDA events (median of many launches). A version with dynamic shared memory names its size in
`flash_smem_bytes`, and its block shape in `flash_threads` and `flash_rows` (the repository's
do; these then win over the defines below). A version's block has the warps its `#define FW`
says (4 where it has none), each warp 16 query rows of a tile times its `#define MT` (1 where it
has none); versions named `pair*` take two tiles per block, the one with the most keys and the
one with the fewest, so every block does about the same work; their tiles are listed in order
of work, longest first. A version whose grid is (heads, tiles) (the repository's: it reads its
tile from `gridDim.y - 1 - blockIdx.y`) takes the tiles as the engine lists them, by the keys
they attend to, fewest first.

    G=engines/native/src/gpu
    python3 flash_bench.py [--ncu] [--case NAME] base=$G/flash.cu+$G/flash_sm90.cu \
        mma=-DFLASH_MMA_SYNC+$G/flash.cu persist=-DPERSIST=1+$G/flash.cu+$G/flash_sm90.cu [torch=sdpa]

(On Hopper, `mma` is the `mma.sync` kernel the engine runs elsewhere, `persist` the `wgmma` one
with its blocks resident.) A version whose `flash_persistent` is 1 is launched with one block an
SM (at most one per item), which walk the (head, tile) items themselves; it takes the tiles'
count as a last argument. A version without a `flash_prefill` for a case's head dimension skips
that case.

A version `torch=sdpa` is PyTorch's own attention (`scaled_dot_product_attention`, causal, GQA,
16-bit, the backend PyTorch picks) over the same prompts laid out densely, one call per prompt,
captured in a CUDA graph and timed as the others: the bar the kernel is held to. `torch=flash`,
`torch=cudnn` or `torch=efficient` ask for that backend of PyTorch's.

Needs a CUDA GPU, PyTorch and the CUDA toolkit's NVRTC (`/usr/local/cuda`). With `--ncu` each
version runs once per case, for Nsight Compute; `--case` keeps the cases whose name starts so.
`FLASH_BENCH_NVRTC` adds NVRTC options, e.g. `--generate-line-info` for Nsight Compute's source
view (`ncu --set full --import-source yes -k regex:flash_prefill`).
"""

import collections
import ctypes
import glob
import math
import os
import re
import statistics
import sys

import torch

GPU_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../engines/native/src/gpu")
# (name, heads, kv heads, head dim, prompt lengths in one step)
CASES = [
    ("q05 2833", 14, 2, 64, [2833]),
    ("q05 mix", 14, 2, 64, [40, 173, 733, 2833]),
    ("q05 16x733", 14, 2, 64, [733] * 16),
    ("l8b 2833", 32, 8, 128, [2833]),
    ("l8b 4xmix", 32, 8, 128, [40, 173, 733, 2833] * 4),
    # head dimensions with an odd count of 16-wide k-steps (tiny test models, some real ones)
    ("hd16 mix", 4, 2, 16, [7, 64, 150]),
    ("hd48 300", 4, 2, 48, [300]),
    ("hd112 300", 8, 2, 112, [300]),
]
BLOCK = 16


def nvrtc_lib():
    for pat in ("/usr/local/cuda/lib64/libnvrtc.so*", "/usr/local/cuda/targets/*/lib/libnvrtc.so*"):
        for path in sorted(glob.glob(pat)):
            if "builtins" not in path:
                return ctypes.CDLL(path)
    raise SystemExit("no libnvrtc under /usr/local/cuda")


NVRTC = nvrtc_lib()
CUDA = ctypes.CDLL("libcuda.so.1")


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")


def compile_cubin(src, arch):
    prog = ctypes.c_void_p()
    check(NVRTC.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None), "nvrtcCreateProgram")
    # sm_90a where the GPU is sm_90: the same code, plus Hopper's wgmma for versions that use it.
    opts = [f"--gpu-architecture=sm_{arch}{'a' if arch == '90' else ''}".encode()]
    opts += [o.encode() for o in os.environ.get("FLASH_BENCH_NVRTC", "").split()]
    r = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    NVRTC.nvrtcGetProgramLog(prog, log)
    if r != 0:
        raise SystemExit(f"compile failed:\n{log.value.decode()[:4000]}")
    NVRTC.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    check(NVRTC.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    return cubin


# A compiled version: its function, dynamic shared memory, the block shape it states (None
# where it states none), registers and local memory per thread.
Kernel = collections.namedtuple("Kernel", "func smem threads rows regs local persistent")


def version_source(spec):
    """A version's source: its `+`-joined files in order, its `-D` elements as defines first."""
    defines, files = [], []
    for part in spec.split("+"):
        if part.startswith("-D"):
            name, _, value = part[2:].partition("=")
            defines.append(f"#define {name} {value}\n")
        else:
            files.append(open(part).read())
    return "".join(defines) + "\n".join(files)


def load_kernel(text, hd, h, kvh, arch):
    base = open(f"{GPU_SRC}/kernels.cu").read() + "\n" + open(f"{GPU_SRC}/gemv.cu").read()
    gq = h // kvh
    defines = f"#define WT 1\n#define KT 1\n#define WARPS 4\n#define HD {hd}\n#define GB {gq}\n#define GQ {gq}\n#define MAX_SPLITS 16\n"
    cubin = compile_cubin(defines + base + "\n" + text, arch)
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    check(CUDA.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    if CUDA.cuModuleGetFunction(ctypes.byref(func), module, b"flash_prefill") != 0:
        return None  # the version has no kernel for this head dimension (or GPU)
    regs = ctypes.c_int()
    CUDA.cuFuncGetAttribute(ctypes.byref(regs), 4, func)  # CU_FUNC_ATTRIBUTE_NUM_REGS
    local = ctypes.c_int()
    CUDA.cuFuncGetAttribute(ctypes.byref(local), 3, func)  # LOCAL_SIZE_BYTES
    # A version with dynamic shared memory says how much in `flash_smem_bytes`, and its block
    # shape in `flash_threads` and `flash_rows` (the repository's does).
    def constant(name):
        val, ptr, size = ctypes.c_int(0), ctypes.c_uint64(), ctypes.c_size_t()
        if CUDA.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), module, name) != 0:
            return None
        check(CUDA.cuMemcpyDtoH_v2(ctypes.byref(val), ptr, 4), "cuMemcpyDtoH")
        return val.value

    smem = constant(b"flash_smem_bytes") or 0
    if smem:
        check(CUDA.cuFuncSetAttribute(func, 8, smem), "cuFuncSetAttribute")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    persistent = bool(constant(b"flash_persistent"))
    return Kernel(func, smem, constant(b"flash_threads"), constant(b"flash_rows"), regs.value, local.value, persistent)


class Case:
    """One step's prompts: a paged cache, queries, the plan's arrays and the reference output."""

    def __init__(self, h, kvh, hd, lens, gen):
        dev = "cuda"
        self.h, self.kvh, self.hd, self.lens = h, kvh, hd, lens
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        nblocks = sum(math.ceil(n / BLOCK) for n in lens) + 3
        order = torch.randperm(nblocks, generator=gen).tolist()
        self.k = torch.randn(nblocks, BLOCK, kvh, hd, generator=gen).half().to(dev)
        self.v = torch.randn(nblocks, BLOCK, kvh, hd, generator=gen).half().to(dev)
        t = sum(lens)
        self.q = torch.randn(t, h, hd, generator=gen).to(dev)
        pos, tab_off, tables, refs = [], [], [], []
        self.chunks, self.tables_of = [], []
        first = 0
        for n in lens:
            nb = math.ceil(n / BLOCK)
            table = [order.pop() for _ in range(nb)]
            off = len(tables)
            tables += table
            self.tables_of.append(table)
            pos += list(range(n))
            tab_off += [off] * n
            self.chunks.append((first, n))
            idx = torch.tensor(table, device=dev)
            kk = self.k[idx].reshape(nb * BLOCK, kvh, hd)[:n].float()
            vv = self.v[idx].reshape(nb * BLOCK, kvh, hd)[:n].float()
            qq = self.q[first : first + n].half().float()
            rep = h // kvh
            kk = kk.repeat_interleave(rep, dim=1).transpose(0, 1)
            vv = vv.repeat_interleave(rep, dim=1).transpose(0, 1)
            o = torch.nn.functional.scaled_dot_product_attention(qq.transpose(0, 1), kk, vv, is_causal=True)
            refs.append(o.transpose(0, 1))
            first += n
        self.t = t
        self.ref = torch.cat(refs)
        self.pos = torch.tensor(pos, dtype=torch.int32, device=dev)
        self.tab_off = torch.tensor(tab_off, dtype=torch.int32, device=dev)
        self.tables = torch.tensor(tables, dtype=torch.int32, device=dev)
        self.out = torch.empty(t, h, hd, dtype=torch.half, device=dev)
        self.flops = sum(4 * hd * h * n * (n + 1) / 2 for n in lens)

    def torch_graph(self, backend):
        """PyTorch's attention over each prompt (dense 16-bit tensors), captured in a CUDA
        graph, with the output it writes; `backend` names one of PyTorch's (`flash`, `cudnn`,
        `efficient`), or `sdpa` lets PyTorch choose."""
        import contextlib

        from torch.nn.attention import SDPBackend, sdpa_kernel

        f = torch.nn.functional.scaled_dot_product_attention
        pick = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
        # A fresh context each time: `sdpa_kernel`'s can be entered once.
        within = (lambda: sdpa_kernel(pick[backend])) if backend in pick else contextlib.nullcontext
        dense = []
        for (first, n), table in zip(self.chunks, self.tables_of):
            idx = torch.tensor(table, device="cuda")
            k = self.k[idx].reshape(-1, self.kvh, self.hd)[:n].transpose(0, 1).unsqueeze(0).contiguous()
            v = self.v[idx].reshape(-1, self.kvh, self.hd)[:n].transpose(0, 1).unsqueeze(0).contiguous()
            q = self.q[first : first + n].half().transpose(0, 1).unsqueeze(0).contiguous()
            dense.append((q, k, v))
        outs = [None] * len(dense)

        def run():
            with within():
                for i, (q, k, v) in enumerate(dense):
                    outs[i] = f(q, k, v, is_causal=True, enable_gqa=True)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        return graph, lambda: torch.cat([o[0].transpose(0, 1) for o in outs])

    def tiles(self, paired, tile, by_keys=False):
        tiles = [(first + a, min(tile, n - a)) for first, n in self.chunks for a in range(0, n, tile)]
        pos = self.pos.tolist()
        if paired:
            tiles = sorted(tiles, key=lambda tn: -(pos[tn[0]] + tn[1]))
        elif by_keys:  # as the engine lists them: fewest keys first (the kernel runs them last)
            tiles = sorted(tiles, key=lambda tn: pos[tn[0]] + tn[1])
        flat = [x for tn in tiles for x in tn]
        return torch.tensor(flat, dtype=torch.int32, device="cuda"), len(tiles)

    def launch(self, kernel, paired, threads, tiles, ntiles, stream, heads_x=False):
        scale_log2 = 1.0 / math.sqrt(self.hd) * math.log2(math.e)
        vals = [
            ctypes.c_uint64(self.q.data_ptr()),
            ctypes.c_uint64(self.k.data_ptr()),
            ctypes.c_uint64(self.v.data_ptr()),
            ctypes.c_uint64(self.pos.data_ptr()),
            ctypes.c_uint64(self.tab_off.data_ptr()),
            ctypes.c_uint64(self.tables.data_ptr()),
            ctypes.c_uint64(tiles.data_ptr()),
            ctypes.c_int32(BLOCK),
            ctypes.c_int64(BLOCK * self.kvh * self.hd),
            ctypes.c_int64(self.kvh * self.hd),
            ctypes.c_int64(self.hd),
            ctypes.c_uint64(self.out.data_ptr()),
            ctypes.c_int32(self.h),
            ctypes.c_int32(self.kvh),
            ctypes.c_float(scale_log2),
            ctypes.c_int32(ntiles),  # read only by versions that take it
        ]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        grid = (ntiles + 1) // 2 if paired else ntiles
        gx, gy = (self.h, grid) if heads_x else (grid, self.h)
        if kernel.persistent:  # a block an SM (at most one per item) walks the (head, tile) items
            gx, gy = min(self.sms, self.h * ntiles), 1
        check(
            CUDA.cuLaunchKernel(
                kernel.func, gx, gy, 1, threads, 1, 1, kernel.smem, ctypes.c_void_p(stream), params, None
            ),
            "launch",
        )


def main():
    args = sys.argv[1:]
    ncu = "--ncu" in args
    versions = [a.split("=", 1) for a in args if "=" in a]
    only = args[args.index("--case") + 1] if "--case" in args else ""
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    stream = torch.cuda.current_stream().cuda_stream
    gen = torch.Generator().manual_seed(1)
    cases = [(name, Case(h, kvh, hd, lens, gen)) for name, h, kvh, hd, lens in CASES if name.startswith(only)]
    kernels = {}
    rows = []
    for vname, path in versions:
        if vname == "torch":
            for cname, c in cases:
                try:
                    graph, result = c.torch_graph(path)
                except (RuntimeError, AttributeError) as e:  # a backend PyTorch lacks here
                    print(f"torch={path} {cname}: {str(e).splitlines()[0][:200]}")
                    continue
                graph.replay()
                torch.cuda.synchronize()
                err = ((result().float() - c.ref).norm() / c.ref.norm()).item()
                times = []
                for _ in range(60):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    graph.replay()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1000)
                med = statistics.median(times)
                rows.append((f"torch {path}", cname, 0, 0, err, med, c.flops / med / 1e6))
            continue
        paired = vname.startswith("pair")
        text = version_source(path)
        fw = re.search(r"^#define FW (\d+)", text, re.M)
        mt = re.search(r"^#define MT (\d+)", text, re.M)
        warps = int(fw.group(1)) if fw else 4
        by_defines = (32 * warps, 16 * warps * (int(mt.group(1)) if mt else 1))
        # A version whose grid is (heads, tiles) takes the tiles as the engine lists them.
        heads_x = "gridDim.y - 1 - blockIdx.y" in text
        for cname, c in cases:
            key = (path, c.hd, c.h, c.kvh)
            if key not in kernels:
                kernels[key] = load_kernel(text, c.hd, c.h, c.kvh, arch)
            kernel = kernels[key]
            if kernel is None:
                print(f"{vname} {cname}: no flash_prefill for this shape")
                continue
            regs, local = kernel.regs, kernel.local
            threads, tile = (kernel.threads, kernel.rows) if kernel.threads else by_defines
            tiles, ntiles = c.tiles(paired, tile, heads_x or kernel.persistent)
            c.out.fill_(float("nan"))
            c.launch(kernel, paired, threads, tiles, ntiles, stream, heads_x)
            torch.cuda.synchronize()
            err = ((c.out.float() - c.ref).norm() / c.ref.norm()).item()
            if ncu:
                rows.append((vname, cname, regs, local, err, 0.0, 0.0))
                continue
            for _ in range(10):
                c.launch(kernel, paired, threads, tiles, ntiles, stream, heads_x)
            times = []
            for _ in range(60):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                c.launch(kernel, paired, threads, tiles, ntiles, stream, heads_x)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000)
            med = statistics.median(times)
            rows.append((vname, cname, regs, local, err, med, c.flops / med / 1e6))
    print(f"{'version':<12} {'case':<12} {'regs':>4} {'local':>5} {'rel err':>9} {'µs':>8} {'TFLOP/s':>8}")
    for v, cn, regs, local, err, med, tf in rows:
        flag = "" if err < 1e-2 else "  WRONG"
        print(f"{v:<12} {cn:<12} {regs:>4} {local:>5} {err:>9.2e} {med:>8.1f} {tf:>8.1f}{flag}")


if __name__ == "__main__":
    main()
