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
// whole 16-byte words; y f32, or the weights' dtype with `narrow`). Such a product only streams
// the weights. Block of 8 warps, 8 / S output rows a block, S warps a row, each taking a slice
// of its 16-byte words; a lane loads 4 words of the weight row at once (all in flight),
// multiplies each by the n activation rows' words (read through L1, shared by every row of the
// block), and the sums meet by shuffles, then through shared memory across the S warps. Every
// output is summed in the same order whatever n is. Each lane widens every activation word
// again for each weight word, so from four rows on cuBLAS is faster (`plan::GEMV_ROWS`).
// One kernel per row capacity NR (`gemv1`, `gemv2`; the host takes the smallest that holds n):
// a lane keeps NR sums, so a batch of one needs fewer registers and more blocks stay resident
// to keep the weights' loads in flight.
// grid (ceil(out / (8 / S))).
#define GEMV_ROWS 2
#if WT != 0
// One weight row's products with the n activation rows, in `acc` of every lane of the warp:
// this warp's slice [c0, c1) of the row's 16-byte words. The weights do not change within a
// step, so a lane's first words are asked for before waiting on the kernel before this one
// (GRID_DEP_WAIT, here): in a decode graph they stream in while it ends.
template <int NR>
__device__ __forceinline__ void gemv_dot(const wt* w_row, bool live, const wt* x, int K, int n, int c0, int c1,
                                         float* acc) {
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
    GRID_DEP_WAIT();
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

template <int NR>
__device__ __forceinline__ void gemv_rows(const wt* w, const wt* x, unsigned long long y, int out, int K, int n,
                                          int S, int narrow) {
    __shared__ float red[8][NR];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int o = blockIdx.x * (8 / S) + warp / S, slice = warp % S;
    int words = K / 8, per = (words + S - 1) / S;
    int c0 = slice * per, c1 = min(words, c0 + per);
    float acc[NR];
    const bool live = o < out;
    gemv_dot<NR>(w + (long long)(live ? o : 0) * K, live, x, K, n, c0, c1, acc);
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
    if (narrow)
        ((wt*)y)[(long long)lane * out + o] = wst(v);
    else
        ((float*)y)[(long long)lane * out + o] = v;
}

// The MLP's gate/up product and SiLU·up in one kernel, for decode steps of n ≤ NR rows:
// out[r][p] = SiLU(g) · u, with g and u rows p and I + p of x[r] · w^T (w [2I][K], gate rows
// then up rows) rounded to the weights' dtype first, so the result is bit for bit what
// `gemv` (narrow) and then `silu_mul` give, one launch and one pass over memory fewer. Each
// block's 8 / S rows are pairs: its first half gate rows p0.., its second half their up rows.
// Needs S ≤ 4 (two rows a block at least). grid (ceil(I / (4 / S))).
template <int NR>
__device__ __forceinline__ void gemv_glu_rows(const wt* w, const wt* x, wt* out, int I, int K, int n, int S) {
    __shared__ float red[8][NR];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int half = 4 / S, row = warp / S, slice = warp % S;
    int p = blockIdx.x * half + row % half;
    const bool live = p < I;
    int o = (row < half ? 0 : I) + (live ? p : 0);
    int words = K / 8, per = (words + S - 1) / S;
    int c0 = slice * per, c1 = min(words, c0 + per);
    float acc[NR];
    gemv_dot<NR>(w + (long long)o * K, live, x, K, n, c0, c1, acc);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < NR; r++) red[warp][r] = acc[r];
    __syncthreads();
    // Thread j·NR + r finishes pair j of sequence r, summing the slices in `gemv`'s order.
    int j = threadIdx.x / NR, r = threadIdx.x % NR;
    p = blockIdx.x * half + j;
    if (j >= half || r >= n || p >= I) return;
    float g = red[j * S][r], u = red[(half + j) * S][r];
    for (int k = 1; k < S; k++) g += red[j * S + k][r], u += red[(half + j) * S + k][r];
    g = wld(wst(g));
    u = wld(wst(u));
    out[(long long)r * I + p] = wst(g / (1.0f + expf(-g)) * u);
}

#define GEMV_KERNEL(NAME, NR)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(const wt* w, const wt* x, unsigned long long y, \
                                                           int out, int K, int n, int S, int narrow) {   \
        gemv_rows<NR>(w, x, y, out, K, n, S, narrow); /* waits (GRID_DEP_WAIT) after its first loads */ \
    }
GEMV_KERNEL(gemv1, 1)
GEMV_KERNEL(gemv2, 2)

#define GEMV_GLU_KERNEL(NAME, NR)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(const wt* w, const wt* x, wt* out, int I, int K, \
                                                           int n, int S) {                                  \
        gemv_glu_rows<NR>(w, x, out, I, K, n, S);                                                           \
    }
GEMV_GLU_KERNEL(gemv_glu1, 1)
GEMV_GLU_KERNEL(gemv_glu2, 2)
#endif
