// Prefill attention on tensor cores: FlashAttention-2's scheme over the paged cache, for
// caches in f16 or bf16 and head dimensions HD (defined by the host) that are a multiple of 16
// and at most 128, on sm_80 and later. The host only loads `flash_prefill` when those hold.
//
// A block takes one tile of up to 64 consecutive query tokens of one sequence (a prompt chunk)
// and one head; each of its 4 warps owns 16 query rows, kept in registers as mma fragments. The
// block walks the sequence's keys 64 at a time: it copies a tile of K (row-major) and of V
// (transposed, so both operands are read as whole 32-bit pairs) from the cache through the
// block table into shared memory, each warp computes its 16 × 64 scores with
// `mma.sync.m16n8k16` (f32 accumulators), masks the causal edge, advances its online softmax
// (base-2: Q is pre-scaled by log2(e) / sqrt(HD)), and accumulates P · V with the scores
// re-used as the A operand straight from the registers. Rows past the tile's end compute
// over the tile's keys and are not written.
//
// Scores and output accumulate in f32; Q and the probabilities enter the tensor cores in the
// cache's type, as in FlashAttention itself. Grid (tiles, H), block 128.

#if KT != 0 && HD % 16 == 0 && HD <= 128 && __CUDA_ARCH__ >= 800

#define BR 64         // query rows per block (4 warps × 16)
#define BC 64         // keys per tile
#define KPAD (HD + 8) // row pitch of the K tile: rows 16 bytes apart in the banks
#define VPAD (BC + 8) // row pitch of the transposed V tile

#if KT == 1
#define MMA16816 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#else
#define MMA16816 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#endif

// c += a · b for one m16n8k16 tile (a: 4 registers of 2 elements, b: 2, c: 4 f32).
__device__ __forceinline__ void mma16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(MMA16816 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two values in the cache's type, `lo` in the low half (the lower column of a fragment).
__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    return (unsigned int)kst(lo) | ((unsigned int)kst(hi) << 16);
}

extern "C" __global__ void __launch_bounds__(128)
flash_prefill(const float* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
              const int* tab_off, const unsigned int* tables, const int* tiles, int bs, long long s_blk,
              long long s_tok, long long s_head, wt* out, int H, int KVH, float scale_log2) {
    alignas(16) __shared__ u16 Ks[BC][KPAD];
    alignas(16) __shared__ u16 Vt[HD][VPAD];
    int t0 = tiles[2 * blockIdx.x], n = tiles[2 * blockIdx.x + 1];
    int h = blockIdx.y, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, tq = lane & 3;  // the fragment's row group and column pair
    const kt* K = (const kt*)k_plane;
    const kt* V = (const kt*)v_plane;
    const unsigned int* tab = tables + tab_off[t0];
    int p0 = pos[t0];
    int last = p0 + n - 1;  // the last key any row of the tile attends to
    int r0 = warp * 16 + g, r1 = r0 + 8;
    // Row r attends to keys 0..p0 + r; rows past the tile's end to the tile's keys.
    int lim0 = p0 + min(r0, n - 1), lim1 = p0 + min(r1, n - 1);
    bool busy = warp * 16 < n;  // whether this warp has a row to write

    // Q fragments: a0 (row g, k 2tq..), a1 (row g+8), a2 (row g, k 2tq+8..), a3 (row g+8, k+8).
    unsigned int qa[HD / 16][4];
    {
        const float* q0 = q + ((long long)(t0 + min(r0, n - 1)) * H + h) * HD;
        const float* q1 = q + ((long long)(t0 + min(r1, n - 1)) * H + h) * HD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            int c = kk * 16 + 2 * tq;
            qa[kk][0] = pack2(q0[c] * scale_log2, q0[c + 1] * scale_log2);
            qa[kk][1] = pack2(q1[c] * scale_log2, q1[c + 1] * scale_log2);
            qa[kk][2] = pack2(q0[c + 8] * scale_log2, q0[c + 9] * scale_log2);
            qa[kk][3] = pack2(q1[c + 8] * scale_log2, q1[c + 9] * scale_log2);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;

    for (int kb = 0; kb * BC <= last; kb++) {
        __syncthreads();  // the previous tile is no longer read
        for (int idx = threadIdx.x; idx < BC * (HD / 8); idx += blockDim.x) {
            int key = idx / (HD / 8), c8 = (idx % (HD / 8)) * 8;
            int j = kb * BC + key;
            u32x4 kv = {0, 0, 0, 0}, vv = {0, 0, 0, 0};
            if (j <= last) {
                long long base =
                    (long long)tab[j / bs] * s_blk + (long long)(j % bs) * s_tok + (long long)kh * s_head + c8;
                kv = *(const u32x4*)(K + base);
                vv = *(const u32x4*)(V + base);
            }
            *(u32x4*)&Ks[key][c8] = kv;
            unsigned int u[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                Vt[c8 + 2 * e][key] = (u16)(u[e] & 0xffffu);
                Vt[c8 + 2 * e + 1][key] = (u16)(u[e] >> 16);
            }
        }
        __syncthreads();
        if (!busy) continue;

        // S = Q Kᵀ: 8 tiles of 16 × 8 keys; b0 (k 2tq.., key g), b1 (k 2tq+8..).
        float s[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const u16* kr = &Ks[nt * 8 + g][kk * 16 + 2 * tq];
                mma16816(s[nt], qa[kk], *(const unsigned int*)kr, *(const unsigned int*)(kr + 8));
            }
        }
        // The causal edge (and keys past the tile's last).
        if (kb * BC + BC - 1 > lim0 || kb * BC + BC - 1 > lim1) {
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                int j = kb * BC + nt * 8 + 2 * tq;
                if (j > lim0) s[nt][0] = NEG_INF;
                if (j + 1 > lim0) s[nt][1] = NEG_INF;
                if (j > lim1) s[nt][2] = NEG_INF;
                if (j + 1 > lim1) s[nt][3] = NEG_INF;
            }
        }
        // Online softmax; a row's maximum is shared by the 4 lanes of its group. Key 0 is in
        // every row's range, so after the first tile the maxima are finite.
        float x0 = NEG_INF, x1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            x0 = fmaxf(x0, fmaxf(s[nt][0], s[nt][1]));
            x1 = fmaxf(x1, fmaxf(s[nt][2], s[nt][3]));
        }
        for (int sh = 1; sh < 4; sh <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, sh));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, sh));
        }
        float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
        float e0 = 0.f, e1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            s[nt][0] = exp2f(s[nt][0] - n0);
            s[nt][1] = exp2f(s[nt][1] - n0);
            s[nt][2] = exp2f(s[nt][2] - n1);
            s[nt][3] = exp2f(s[nt][3] - n1);
            e0 += s[nt][0] + s[nt][1];
            e1 += s[nt][2] + s[nt][3];
        }
        l0 = l0 * c0 + e0;  // this lane's part of the row sum; summed over the group at the end
        l1 = l1 * c1 + e1;
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            o[d][0] *= c0;
            o[d][1] *= c0;
            o[d][2] *= c1;
            o[d][3] *= c1;
        }
        // O += P · V: the scores' accumulator layout is the A operand's, two n-tiles per k-step.
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            unsigned int pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                                  pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const u16* vr = &Vt[d * 8 + g][kk * 16 + 2 * tq];
                mma16816(o[d], pa, *(const unsigned int*)vr, *(const unsigned int*)(vr + 8));
            }
        }
    }
    if (!busy) return;
    for (int sh = 1; sh < 4; sh <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
        l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
    }
    float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int c = d * 8 + 2 * tq;
        if (r0 < n) {
            wt* w = out + ((long long)(t0 + r0) * H + h) * HD + c;
            w[0] = wst(o[d][0] * i0);
            w[1] = wst(o[d][1] * i0);
        }
        if (r1 < n) {
            wt* w = out + ((long long)(t0 + r1) * H + h) * HD + c;
            w[0] = wst(o[d][2] * i1);
            w[1] = wst(o[d][3] * i1);
        }
    }
}

#endif
