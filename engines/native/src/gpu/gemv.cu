// Products of a few rows (decode steps of up to GEMV_ROWS sequences) against 16-bit weights,
// compiled after kernels.cu (its types and conversions).

// Eight 16-bit values of a 16-byte word, as f32.
__device__ __forceinline__ void unpack8(u32x4 v, float* f) {
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = wld((u16)(w[i] & 0xffffu));
        f[2 * i + 1] = wld((u16)(w[i] >> 16));
    }
}

// y[r][o] = Σ_i x[r][i] · w[o][i] for the n ≤ GEMV_ROWS rows of a decode step of one or two
// sequences (w [out][K], x [n][K] in the weights' 16-bit dtype, K a multiple of 8 so rows are
// whole 16-byte words). Such a product only streams the weights. Block of 8 warps, 8 / S output
// rows a block, S warps a row, each taking a slice of its 16-byte words; a lane loads 4 words of
// the weight row at once (all in flight), multiplies each by the n activation rows' words (read
// through L1, or from shared memory, shared by every row of the block), and the sums meet by
// shuffles, then through shared memory across the S warps. Every output is summed in the same
// order whatever n is. Each lane widens every activation word again for each weight word, so
// from four rows on cuBLAS is faster (`plan::GEMV_ROWS`).
// One kernel per row capacity NR (`gemv1`, `gemv2`; the host takes the smallest that holds n):
// a lane keeps NR sums, so a batch of one needs fewer registers and more blocks stay resident
// to keep the weights' loads in flight.
// `mode` says where y[r][o] goes: 0 an f32 y, 1 a y in the weights' dtype, 2 added into the
// residual stream y (the weights' dtype) after rounding to it, the sum rounded again (as
// PyTorch's models round a product and then its residual add: the products before a norm). The
// `_norm` kernels (one row) take the residual stream instead of x, and each block works
// RMSNorm(res) · nw out into shared memory before its products, where `rmsnorm` would have
// written it to act: the same threads sum the same values in the same order, so a decode step
// of one sequence runs no norm kernel (HID-wide rows, K = HID).
// grid (ceil(out / (8 / S))).
#define GEMV_ROWS 2
#if WT != 0
// Where a `_norm` kernel's activation rows come from: the residual stream's first n rows (HID
// values each, in the weights' dtype), the norm's weight and epsilon, and the block's shared rows
// to write.
struct NormIn {
    const wt* res;
    const wt* w;
    float eps;
    wt* act;
};

// act[r] = RMSNorm(res[r]) · w for r < n, by the whole block (256 threads, `rmsnorm`'s
// partition of a row and its sums), then a barrier: afterwards every warp reads any row.
__device__ __forceinline__ void norm_rows(const NormIn& nm, int n) {
#if ROW_VECS > 0
    __shared__ float sh[32];
    for (int r = 0; r < n; r++) {
        const wt* xr = nm.res + (long long)r * HID;
        float a[ROW_VECS][4], wv[ROW_VECS][4];
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < HID) {
                wld4(xr + i, a[k]);
                wld4(nm.w + i, wv[k]);
            }
        }
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < HID) ss += a[k][0] * a[k][0] + a[k][1] * a[k][1] + a[k][2] * a[k][2] + a[k][3] * a[k][3];
        }
        float inv = 1.0f / sqrtf(block_sum(ss, sh) / HID + nm.eps);
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < HID) {
                float o[4];
                o[0] = wv[k][0] * (a[k][0] * inv), o[1] = wv[k][1] * (a[k][1] * inv),
                o[2] = wv[k][2] * (a[k][2] * inv), o[3] = wv[k][3] * (a[k][3] * inv);
                wst4(nm.act + (long long)r * HID + i, o);
            }
        }
    }
    __syncthreads();
#endif
}

// One weight row's products with the n activation rows, in `acc` of every lane of the warp:
// this warp's slice [c0, c1) of the row's 16-byte words. The weights do not change within a
// step, so in a block's `first` row a lane's first words are asked for before waiting on the
// kernel before this one (GRID_DEP_WAIT, here): in a decode graph they stream in while it ends.
// With NORM the activation rows are worked out after that wait (`norm_rows`: every thread of
// the block calls this with the same `first`) and x is ignored.
template <int NR, bool NORM>
__device__ __forceinline__ void gemv_dot(const wt* w_row, bool live, const wt* x, const NormIn& nm, int K, int n,
                                         int c0, int c1, bool first, float* acc) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    const u32x4* wr = (const u32x4*)w_row;
    int c = c0 + lane;
    u32x4 wv[4];
    if (live) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + 32 * u < c1) wv[u] = wr[c + 32 * u];
    }
    if (first) {
        GRID_DEP_WAIT();
        if constexpr (NORM) norm_rows(nm, n);
    }
    if constexpr (NORM) x = nm.act;
    if (live) {
        for (; c < c1; c += 128) {
            if (c != c0 + lane) {
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (c + 32 * u < c1) wv[u] = wr[c + 32 * u];
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (c + 32 * u >= c1) break;
                float wf[8];
                unpack8(wv[u], wf);
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    if (r >= n) break;
                    float xf[8];
                    unpack8(((const u32x4*)(x + (long long)r * K))[c + 32 * u], xf);
                    float s = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++) s += wf[j] * xf[j];
                    acc[r] += s;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
        for (int sh = 16; sh > 0; sh >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], sh);
}

// Group g of a product's rows (8 / S of them) by the whole block: `first` in the block's first
// group (`gemv_dot`). `red` is the block's shared [8][NR] sums.
template <int NR, bool NORM>
__device__ __forceinline__ void gemv_group(const wt* w, const wt* x, const NormIn& nm, unsigned long long y, int out,
                                           int K, int n, int S, int mode, int g, bool first, float (*red)[NR]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int o = g * (8 / S) + warp / S, slice = warp % S;
    int words = K / 8, per = (words + S - 1) / S;
    int c0 = slice * per, c1 = min(words, c0 + per);
    float acc[NR];
    const bool live = o < out;
    gemv_dot<NR, NORM>(w + (long long)(live ? o : 0) * K, live, x, nm, K, n, c0, c1, first, acc);
    if (S > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < NR; r++) red[warp][r] = acc[r];
        __syncthreads();
        if (slice != 0) return;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float s = 0.f;
            for (int k = 0; k < S; k++) s += red[warp + k][r];
            acc[r] = s;
        }
    }
    if (o >= out || lane >= n) return;
    // Lane r writes row r's output (acc is the same in every lane after the shuffles).
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < NR; r++)
        if (lane == r) v = acc[r];
    long long at = (long long)lane * out + o;
    if (mode == 1)
        ((wt*)y)[at] = wst(v);
    else if (mode == 2)
        ((wt*)y)[at] = wst(wld(((wt*)y)[at]) + wld(wst(v)));
    else
        ((float*)y)[at] = v;
}

// The MLP's gate/up product and SiLU·up in one kernel, for decode steps of n ≤ NR rows:
// out[r][p] = SiLU(g) · u, with g and u rows p and I + p of x[r] · w^T (w [2I][K], gate rows
// then up rows) rounded to the weights' dtype first, so the result is bit for bit what
// `gemv` (narrow) and then `silu_mul` give, one launch and one pass over memory fewer. Group g's
// 8 / S rows are pairs: its first half gate rows p0.., its second half their up rows. Needs
// S ≤ 4 (two rows a group at least).
template <int NR, bool NORM>
__device__ __forceinline__ void gemv_glu_group(const wt* w, const wt* x, const NormIn& nm, wt* out, int I, int K,
                                               int n, int S, int g, bool first, float (*red)[NR]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int half = 4 / S, row = warp / S, slice = warp % S;
    int p = g * half + row % half;
    const bool live = p < I;
    int o = (row < half ? 0 : I) + (live ? p : 0);
    int words = K / 8, per = (words + S - 1) / S;
    int c0 = slice * per, c1 = min(words, c0 + per);
    float acc[NR];
    gemv_dot<NR, NORM>(w + (long long)o * K, live, x, nm, K, n, c0, c1, first, acc);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; r++) red[warp][r] = acc[r];
    __syncthreads();
    // Thread j·NR + r finishes pair j of sequence r, summing the slices in `gemv`'s order.
    int j = threadIdx.x / NR, r = threadIdx.x % NR;
    p = g * half + j;
    if (j >= half || r >= n || p >= I) return;
    float gv = red[j * S][r], u = red[(half + j) * S][r];
    for (int k = 1; k < S; k++) gv += red[j * S + k][r], u += red[(half + j) * S + k][r];
    gv = wld(wst(gv));
    u = wld(wst(u));
    out[(long long)r * I + p] = wst(gv / (1.0f + expf(-gv)) * u);
}

// The plain kernels take one group a block (grid: the groups). The `_norm` kernels' grid is
// kept to the blocks resident at once (the host asks the driver how many), and each block
// works its row out once, then takes groups blockIdx.x, + gridDim.x, ...
#define GEMV_KERNEL(NAME, NR)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(const wt* w, const wt* x, unsigned long long y, int out, \
                                                           int K, int n, int S, int mode) {                       \
        __shared__ float red[8][NR];                                                                           \
        gemv_group<NR, false>(w, x, NormIn{}, y, out, K, n, S, mode, blockIdx.x, true, red);                   \
    }
GEMV_KERNEL(gemv1, 1)
GEMV_KERNEL(gemv2, 2)

#define GEMV_GLU_KERNEL(NAME, NR)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(const wt* w, const wt* x, wt* out, int I, int K, \
                                                           int n, int S) {                                  \
        __shared__ float red[8][NR];                                                                        \
        gemv_glu_group<NR, false>(w, x, NormIn{}, out, I, K, n, S, blockIdx.x, true, red);                  \
    }
GEMV_GLU_KERNEL(gemv_glu1, 1)
GEMV_GLU_KERNEL(gemv_glu2, 2)

#if ROW_VECS > 0 && HID % 8 == 0
// The same products of RMSNorm(res[r]) · nw (K = HID), the rows worked out by each block; for
// one row only (`plan::norms_fused_fit`).
#define GEMV_NORM_KERNEL(NAME, NR)                                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const wt* w, const wt* res, const wt* nw, float eps, unsigned long long y, int out, int n, int S, \
             int mode) {                                                                                     \
        __shared__ __align__(16) wt act[NR * HID];                                                           \
        __shared__ float red[8][NR];                                                                         \
        int groups = (out + 8 / S - 1) / (8 / S);                                                            \
        for (int g = blockIdx.x; g < groups; g += gridDim.x) {                                               \
            if (g != blockIdx.x) __syncthreads(); /* the last group's `red` read before its next writes */   \
            gemv_group<NR, true>(w, nullptr, NormIn{res, nw, eps, act}, y, out, HID, n, S, mode, g, g == blockIdx.x, red); \
        }                                                                                                    \
    }
GEMV_NORM_KERNEL(gemv_norm, 1)

#define GEMV_GLU_NORM_KERNEL(NAME, NR)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const wt* w, const wt* res, const wt* nw, float eps, wt* out, int I, int n, int S) {            \
        __shared__ __align__(16) wt act[NR * HID];                                                           \
        __shared__ float red[8][NR];                                                                         \
        int groups = (I + 4 / S - 1) / (4 / S);                                                              \
        for (int g = blockIdx.x; g < groups; g += gridDim.x) {                                               \
            if (g != blockIdx.x) __syncthreads(); /* the last group's `red` read before its next writes */   \
            gemv_glu_group<NR, true>(w, nullptr, NormIn{res, nw, eps, act}, out, I, HID, n, S, g, g == blockIdx.x, red); \
        }                                                                                                    \
    }
GEMV_GLU_NORM_KERNEL(gemv_glu_norm, 1)
#endif
#endif
