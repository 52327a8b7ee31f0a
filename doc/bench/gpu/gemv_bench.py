"""Check and time versions of the native engine's small-batch product kernel (`gemv`).

Each version is a copy of `engines/native/src/gpu/gemv.cu` (the repository's is `base`). It is
compiled with NVRTC as the engine assembles it (the defines, `kernels.cu`, then the version's
`gemv.cu`) and launched as the engine launches the repository's: grid ceil(out / (8 / S)), 256
threads, S = `plan::gemv_split(K)`. A version that launches otherwise says so in one line,

    // launch: GRID, BLOCK, S

three Python expressions over `out`, `K`, `n` (rows), `sms` (the GPU's multiprocessors), `W`
(the version's `#define GEMV_W`, 4 without one) and `splitw(K, W)` (the warps sharing a row so
that a lane loads at most W words; `split` is `splitw(K, 4)`, the repository's rule); and one
that names its kernel by the row count, in a line `// kernel: NAME`, a Python expression over
`n` (without one: the smallest `gemvN` it defines as the repository does that holds n, none
past the largest, else `gemv`). Every product of a decode step of three shapes (Qwen2.5-0.5B, its
151,936-word head, Llama-3.1-8B) at 1, 2, 4 and 8 rows is checked against PyTorch in float32 and
timed with CUDA events over a CUDA graph of at least 20 launches (the median of 15 replays), the
weights rotated through copies that together exceed the L2 cache, as a decode step meets each
layer's weights. cuBLAS
(`torch.nn.functional.linear`, 16-bit in and out) is timed the same way beside them.

    python3 gemv_bench.py [--ncu] [--case NAME] base=engines/native/src/gpu/gemv.cu other=/path/gemv.cu[#W]

Needs a CUDA GPU, PyTorch and the CUDA toolkit's NVRTC (`/usr/local/cuda`). With `--ncu` each
version runs once per case, for Nsight Compute; `--case` keeps the cases whose name starts so.
"""

import ctypes
import math
import os
import re
import statistics
import sys

import torch

from flash_bench import CUDA, check, compile_cubin

GPU_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../engines/native/src/gpu")
# (shape, product, out, K): the projections of one layer and the head.
PRODUCTS = [
    ("q05", "qkv", 1152, 896),
    ("q05", "o", 896, 896),
    ("q05", "gate_up", 9728, 896),
    ("q05", "down", 896, 4864),
    ("q05", "head", 32768, 896),
    ("q05v", "head", 151936, 896),
    ("l8b", "qkv", 6144, 4096),
    ("l8b", "o", 4096, 4096),
    ("l8b", "gate_up", 28672, 4096),
    ("l8b", "down", 4096, 14336),
    ("l8b", "head", 128256, 4096),
]
ROWS = [1, 2, 4, 8]
# Bytes of weights a case rotates through: twice the H200's 50 MB L2.
ROTATE_BYTES = 100 << 20
DEFAULT_LAUNCH = "ceil(out / (8 // split)), 256, split"


def splitw(k, w):
    """Warps sharing a row (a power of two up to 8), so that a lane loads at most `w` words;
    `plan::gemv_split` is `splitw(k, 4)`."""
    words, s = k // 8, 1
    while s < 8 and words > 32 * w * s:
        s *= 2
    return s


def default_kernel(text):
    """The kernel of a version without a `// kernel:` line: where it has one kernel per row
    capacity (`GEMV_KERNEL(gemvN, N)`), the smallest that holds n (None past the largest: the
    engine takes cuBLAS there), else `gemv`."""
    caps = sorted(int(c) for c in re.findall(r"GEMV_KERNEL\(gemv(\d+),", text))
    if caps:
        return f"next(('gemv%d' % c for c in {caps} if c >= n), None)"
    return '"gemv"'


def load_kernel(path, arch):
    # `file.cu#W` compiles the file with W words in flight per lane (its `#define GEMV_W`).
    path, _, words = path.partition("#")
    text = open(path).read()
    if words:
        text = re.sub(r"^#define GEMV_W \d+", f"#define GEMV_W {int(words)}", text, count=1, flags=re.M)
    base = open(f"{GPU_SRC}/kernels.cu").read()
    defines = "#define WT 1\n#define KT 1\n#define WARPS 4\n#define HD 64\n#define GB 7\n#define GQ 7\n#define MAX_SPLITS 16\n"
    cubin = compile_cubin(defines + base + "\n" + text, arch)
    module = ctypes.c_void_p()
    check(CUDA.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    launch = re.search(r"^// launch: (.*)$", text, re.M)
    kernel = re.search(r"^// kernel: (.*)$", text, re.M)
    w = re.search(r"^#define GEMV_W (\d+)", text, re.M)
    return Version(module, launch.group(1) if launch else DEFAULT_LAUNCH,
                   kernel.group(1) if kernel else default_kernel(text), int(w.group(1)) if w else 4)


class Version:
    """A compiled version: its module, how it launches and which kernel takes n rows."""

    def __init__(self, module, launch, kernel, w):
        self.module, self.launch, self.kernel, self.w = module, launch, kernel, w
        self.funcs = {}

    def func(self, n):
        """The kernel for n rows and its registers, or None where the version has none."""
        name = eval(self.kernel, {"n": n})
        if name is None:
            return None
        if name not in self.funcs:
            f = ctypes.c_void_p()
            check(CUDA.cuModuleGetFunction(ctypes.byref(f), self.module, name.encode()), f"kernel {name}")
            regs = ctypes.c_int()
            CUDA.cuFuncGetAttribute(ctypes.byref(regs), 4, f)  # CU_FUNC_ATTRIBUTE_NUM_REGS
            self.funcs[name] = (f, regs.value)
        return self.funcs[name]


class Case:
    """One product at one row count: rotated weight copies, the activations, the reference."""

    def __init__(self, out, k, n, gen):
        self.out, self.k, self.n = out, k, n
        copies = max(1, math.ceil(ROTATE_BYTES / (out * k * 2)))
        self.w = [(torch.randn(out, k, generator=gen, device="cuda") * 0.05).half() for _ in range(copies)]
        self.x = torch.randn(n, k, generator=gen, device="cuda").half()
        self.ref = self.x.float() @ self.w[0].float().T
        self.y = torch.empty(n, out, device="cuda")
        self.next = 0
        # Calls a timed graph holds: every copy once, and at least 20.
        self.reps = max(20, copies)

    def weights(self):
        w = self.w[self.next % len(self.w)]
        self.next += 1
        return w

    def launch(self, version, sms, w=None):
        ns = {"out": self.out, "K": self.k, "n": self.n, "sms": sms, "W": version.w, "splitw": splitw,
              "split": splitw(self.k, 4), "ceil": math.ceil}
        grid, block, s = (int(v) for v in eval(version.launch, ns))
        func = version.func(self.n)[0]
        w = self.weights() if w is None else w
        vals = [
            ctypes.c_uint64(w.data_ptr()),
            ctypes.c_uint64(self.x.data_ptr()),
            ctypes.c_uint64(self.y.data_ptr()),
            ctypes.c_int32(self.out),
            ctypes.c_int32(self.k),
            ctypes.c_int32(self.n),
            ctypes.c_int32(s),
            ctypes.c_int32(0),  # f32 output
        ]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        # The current stream: the capturing one while a graph is captured.
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(CUDA.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, stream, params, None), "launch")


def median_us(run, reps, times=15):
    """Microseconds per call of `run`: `reps` calls captured in one CUDA graph (as a decode
    step runs the products), the graph replayed `times` times, the median replay over `reps`.
    Timing calls one by one from Python would time Python's launches (tens of µs a call)
    instead of the kernels whenever a kernel is shorter."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            run()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(times):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(out)


def main():
    args = sys.argv[1:]
    ncu = "--ncu" in args
    versions = [a.split("=", 1) for a in args if "=" in a]
    only = args[args.index("--case") + 1] if "--case" in args else ""
    torch.zeros(1, device="cuda")
    major, minor = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernels = {name: load_kernel(path, f"{major}{minor}") for name, path in versions}
    gen = torch.Generator(device="cuda").manual_seed(1)
    print(f"{'case':<20} {'MB':>7} {'cuBLAS µs':>9} {'TB/s':>5}" + "".join(f" {v[:12]:>12} {'TB/s':>5}" for v, _ in versions))
    for shape, prod, out, k in PRODUCTS:
        for n in ROWS:
            name = f"{shape} {prod} n{n}"
            if not name.startswith(only):
                continue
            c = Case(out, k, n, gen)
            mb = out * k * 2 / 1e6
            line = f"{name:<20} {mb:>7.1f}"
            if ncu:
                torch.nn.functional.linear(c.x, c.weights())
            else:
                t = median_us(lambda: torch.nn.functional.linear(c.x, c.weights()), c.reps)
                line += f" {t:>9.1f} {mb / t:>5.2f}"
            for vname, _ in versions:
                version = kernels[vname]
                if version.func(n) is None:
                    line += f" {'–':>12} {'':>5}"
                    continue
                c.y.fill_(float("nan"))
                c.launch(version, sms, w=c.w[0])
                torch.cuda.synchronize()
                err = ((c.y - c.ref).norm() / c.ref.norm()).item()
                flag = "" if err < 1e-3 else "!"
                if ncu:
                    line += f" {'ran':>12}{flag}"
                    continue
                t = median_us(lambda: c.launch(version, sms), c.reps)
                line += f" {t:>12.1f} {mb / t:>5.2f}{flag}"
            print(line, flush=True)
            del c
            torch.cuda.empty_cache()
    for vname, _ in versions:
        v = kernels[vname]
        regs = ", ".join(f"{name} {r}" for name, (_, r) in sorted(v.funcs.items()))
        print(f"{vname}: registers {regs}; launch {v.launch}; W {v.w}")
    print("! marks a result off PyTorch's by more than 1e-3 (relative norm)")


if __name__ == "__main__":
    main()
