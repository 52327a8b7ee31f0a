"""Check the pieces of the Hopper prefill attention (`engines/native/src/gpu/flash_sm90.cu`) one
at a time on an sm_90 GPU: one warpgroup stores random Q, K and V tiles in shared memory in the
kernel's 128-byte swizzled layout, then computes S = Q · Kᵀ (`issue_qk`: both operands by
descriptor, K-major) and O = P · V with P = S in the cache's type taken from the score registers
(`to_p`, `issue_pv`: V by descriptor, transposed), and writes both from the accumulator layout
the kernel assumes. Each is compared with PyTorch: a wrong descriptor, swizzle or fragment
layout shows as a large error in one of them. The source is the engine's (`flash.cu`, then
`flash_sm90.cu`), or a version as `flash_bench.py` names one.

    python3 doc/bench/gpu/wgmma_check.py [version]
"""

import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flash_bench  # noqa: E402  (compile_cubin, check, version_source, the GPU source folder)

CHECK = r"""
// A 64 × N accumulator tile (N / 2 registers a thread: block nt of 8 columns holds row r0's
// columns 2tq, 2tq + 1, then row r0 + 8's) written out row-major.
template <int N>
__device__ void store_tile(float* out, const float* a, int r0, int tq) {
    for (int nt = 0; nt < N / 8; nt++) {
        int c = nt * 8 + 2 * tq;
        out[r0 * N + c] = a[4 * nt];
        out[r0 * N + c + 1] = a[4 * nt + 1];
        out[(r0 + 8) * N + c] = a[4 * nt + 2];
        out[(r0 + 8) * N + c + 1] = a[4 * nt + 3];
    }
}

// One warpgroup: Q (64 rows), K and V (128 key rows) in the swizzled layout, S and O out.
extern "C" __global__ void __launch_bounds__(128) wgmma_check(const u16* q, const u16* k, const u16* v, float* s_out,
                                                          float* o_out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned int base = (smem_addr(smem) + 1023) & ~1023u;
    const unsigned int sq = base, sk = base + Q_WG, sv = sk + KV_TILE;
    const int t = threadIdx.x, lane = t & 31, g = lane >> 2, tq = lane & 3, w = t >> 5;
    for (int idx = t; idx < 128 * (HD / 8); idx += 128) {
        int r = idx / (HD / 8), c8 = idx % (HD / 8);
        unsigned int at = (c8 >> 3) * (BC * 128) + r * 128 + (((c8 & 7) ^ (r & 7)) * 16);
        uint4 kw = *(const uint4*)(k + r * HD + c8 * 8), vw = *(const uint4*)(v + r * HD + c8 * 8);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(sk + at), "r"(kw.x), "r"(kw.y), "r"(kw.z), "r"(kw.w));
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(sv + at), "r"(vw.x), "r"(vw.y), "r"(vw.z), "r"(vw.w));
        if (r < 64) {
            unsigned int aq = (c8 >> 3) * (64 * 128) + r * 128 + (((c8 & 7) ^ (r & 7)) * 16);
            uint4 qw = *(const uint4*)(q + r * HD + c8 * 8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(sq + aq), "r"(qw.x), "r"(qw.y), "r"(qw.z), "r"(qw.w));
        }
    }
    fence_async();
    __syncthreads();
    float s[BC / 2], o[HD / 2];
    unsigned int p[BC / 16][4];
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    wgmma_fence();
    issue_qk(s, sq, sk);
    wgmma_wait<0>();
    pin<BC / 2>(s);
    const int r0 = w * 16 + g;
    store_tile<BC>(s_out, s, r0, tq);
    to_p(p, s);
    wgmma_fence();
    issue_pv(o, p, sv);
    wgmma_wait<0>();
    pin<HD / 2>(o);
    store_tile<HD>(o_out, o, r0, tq);
}
"""


def run(version, hd, kt):
    gpu = flash_bench.GPU_SRC
    defines = f"#define WT {kt}\n#define KT {kt}\n#define WARPS 4\n#define HD {hd}\n#define GB 4\n#define GQ 4\n#define MAX_SPLITS 16\n"
    src = defines + open(f"{gpu}/kernels.cu").read() + "\n" + open(f"{gpu}/gemv.cu").read() + "\n" + version
    # the helpers are inside the kernel's own #if (the last one); the check goes in there too
    at = src.rindex("#endif")
    src = src[:at] + CHECK + src[at:]
    cubin = flash_bench.compile_cubin(src, "90")
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    flash_bench.check(flash_bench.CUDA.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    flash_bench.check(flash_bench.CUDA.cuModuleGetFunction(ctypes.byref(func), module, b"wgmma_check"), "wgmma_check")
    smem = 64 * hd * 2 + 2 * 128 * hd * 2 + 1024
    flash_bench.check(flash_bench.CUDA.cuFuncSetAttribute(func, 8, smem), "cuFuncSetAttribute")
    dt = torch.float16 if kt == 1 else torch.bfloat16
    gen = torch.Generator().manual_seed(hd + kt)
    q = (torch.randn(64, hd, generator=gen) / hd**0.5).to(dt).cuda()
    k = torch.randn(128, hd, generator=gen).to(dt).cuda()
    v = torch.randn(128, hd, generator=gen).to(dt).cuda()
    s = torch.empty(64, 128, device="cuda")
    o = torch.empty(64, hd, device="cuda")
    vals = [ctypes.c_uint64(x.data_ptr()) for x in (q, k, v, s, o)]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(x) for x in vals])
    stream = torch.cuda.current_stream().cuda_stream
    flash_bench.check(
        flash_bench.CUDA.cuLaunchKernel(func, 1, 1, 1, 128, 1, 1, smem, ctypes.c_void_p(stream), params, None), "launch"
    )
    torch.cuda.synchronize()
    s_ref = q.float() @ k.float().T
    o_ref = s_ref.to(dt).float() @ v.float()
    es = ((s - s_ref).norm() / s_ref.norm()).item()
    eo = ((o - o_ref).norm() / o_ref.norm()).item()
    ok = es < 1e-3 and eo < 1e-2
    print(f"HD {hd} {'f16' if kt == 1 else 'bf16'}: S rel err {es:.2e}, O rel err {eo:.2e} {'ok' if ok else 'WRONG'}")
    return ok


def main():
    g = flash_bench.GPU_SRC
    version = flash_bench.version_source(sys.argv[1] if len(sys.argv) > 1 else f"{g}/flash.cu+{g}/flash_sm90.cu")
    torch.zeros(1, device="cuda")
    results = [run(version, hd, kt) for hd in (128, 64) for kt in (1, 2)]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
