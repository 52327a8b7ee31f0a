// Candidate: the row count as a template parameter (one kernel per 1/2/4/8 rows: registers and
// shuffles for the rows there are), and GEMV_W 16-byte words in flight per lane.
// kernel: "gemv%d" % (1 if n <= 1 else 2 if n <= 2 else 4 if n <= 4 else 8)
// launch: ceil(out / (8 // splitw(K, W))), 256, splitw(K, W)
#define GEMV_W 8
#ifndef GEMV_W
#define GEMV_W 8
#endif

__device__ __forceinline__ void unpack8(u32x4 v, float* f) {
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = wld((u16)(w[i] & 0xffffu));
        f[2 * i + 1] = wld((u16)(w[i] >> 16));
    }
}

#define GEMV_ROWS 8
#if WT != 0
template <int NR>
__device__ __forceinline__ void gemv_rows(const wt* w, const wt* x, unsigned long long y, int out, int K, int n,
                                          int S, int narrow) {
    __shared__ float red[8][NR];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int o = blockIdx.x * (8 / S) + warp / S, slice = warp % S;
    int words = K / 8, per = (words + S - 1) / S;
    int c0 = slice * per, c1 = min(words, c0 + per);
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    if (o < out) {
        const u32x4* wr = (const u32x4*)(w + (long long)o * K);
        for (int c = c0 + lane; c < c1; c += 32 * GEMV_W) {
            u32x4 wv[GEMV_W];
#pragma unroll
            for (int u = 0; u < GEMV_W; u++)
                if (c + 32 * u < c1) wv[u] = wr[c + 32 * u];
#pragma unroll
            for (int u = 0; u < GEMV_W; u++) {
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
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < NR; r++)
        if (lane == r) v = acc[r];
    if (narrow)
        ((wt*)y)[(long long)lane * out + o] = wst(v);
    else
        ((float*)y)[(long long)lane * out + o] = v;
}

#define GEMV_KERNEL(NAME, NR)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                              \
    NAME(const wt* w, const wt* x, unsigned long long y, int out, int K, int n, int S, int narrow) { \
        gemv_rows<NR>(w, x, y, out, K, n, S, narrow);                                              \
    }
GEMV_KERNEL(gemv1, 1)
GEMV_KERNEL(gemv2, 2)
GEMV_KERNEL(gemv4, 4)
GEMV_KERNEL(gemv8, 8)
#endif
