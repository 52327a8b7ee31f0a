// The native engine's forward pass on NVIDIA GPUs, compiled at run time with NVRTC.
//
// The host prepends `#define WT n` (weights and matmul inputs) and `#define KT n` (KV cache),
// n = 0 f32, 1 f16, 2 bf16. Everything accumulates in f32; the residual stream and every
// matmul output are f32 (cuBLAS writes f32 from f16/bf16 inputs), only matmul inputs and the
// cache are stored in the narrow types. No #includes: 16-bit types are converted by hand.

typedef unsigned short u16;
#define NEG_INF __int_as_float(0xff800000)
// 16-byte words, for whole-word loads of aligned rows.
struct alignas(16) u32x4 { unsigned int x, y, z, w; };
struct alignas(16) f32x4 { float x, y, z, w; };

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ u16 f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                       // round to nearest even
    return (u16)(u >> 16);
}

#if WT == 0
typedef float wt;
__device__ __forceinline__ float wld(wt v) { return v; }
__device__ __forceinline__ wt wst(float v) { return v; }
#elif WT == 1
typedef u16 wt;
__device__ __forceinline__ float wld(wt v) { return h2f(v); }
__device__ __forceinline__ wt wst(float v) { return f2h(v); }
#else
typedef u16 wt;
__device__ __forceinline__ float wld(wt v) { return b2f(v); }
__device__ __forceinline__ wt wst(float v) { return f2b(v); }
#endif

#if KT == 0
typedef float kt;
__device__ __forceinline__ float kld(kt v) { return v; }
__device__ __forceinline__ kt kst(float v) { return v; }
#elif KT == 1
typedef u16 kt;
__device__ __forceinline__ float kld(kt v) { return h2f(v); }
__device__ __forceinline__ kt kst(float v) { return f2h(v); }
#else
typedef u16 kt;
__device__ __forceinline__ float kld(kt v) { return b2f(v); }
__device__ __forceinline__ kt kst(float v) { return f2b(v); }
#endif

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ float block_sum(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}

// x[t] = embed[ids[t]]. grid (T), block 256.
extern "C" __global__ void embed(const unsigned int* ids, const wt* emb, float* x, int hid) {
    long long t = blockIdx.x;
    const wt* e = emb + (long long)ids[t] * hid;
    for (int i = threadIdx.x; i < hid; i += blockDim.x) x[t * hid + i] = wld(e[i]);
}

// x[src] += delta[src]; out[r] = RMSNorm(x[src]) * w, src = rows ? rows[r] : r.
// grid (rows), block 256.
extern "C" __global__ void add_rmsnorm(float* x, const float* delta, const int* rows, int use_rows,
                                       const wt* w, wt* out, int hid, float eps) {
    __shared__ float sh[32];
    long long r = blockIdx.x;
    long long src = use_rows ? rows[r] : r;
    float* xr = x + src * hid;
    const float* dr = delta + src * hid;
    float ss = 0.f;
    for (int i = threadIdx.x; i < hid; i += blockDim.x) {
        float v = xr[i] + dr[i];
        xr[i] = v;
        ss += v * v;
    }
    float inv = 1.0f / sqrtf(block_sum(ss, sh) / hid + eps);
    for (int i = threadIdx.x; i < hid; i += blockDim.x) out[r * hid + i] = wst(wld(w[i]) * (xr[i] * inv));
}

// After the QKV projection, for one (token, head) of Q, K or V: bias, per-head RMSNorm (Q, K),
// RoPE (Q, K); Q goes to q_out, K and V into the paged cache at the token's slot, found through
// the block table and the layout's strides (elements). grid (T, H + 2 KVH), block 128.
extern "C" __global__ void qkv_post(const float* qkv, const wt* bias, int has_bias, const wt* qn, const wt* kn,
                                    int has_norm, const float* cos_t, const float* sin_t, const int* pos,
                                    const int* tab_off, const unsigned int* tables, unsigned long long k_plane,
                                    unsigned long long v_plane, int bs, long long s_blk, long long s_tok,
                                    long long s_head, float* q_out, int H, int KVH, int D, float eps) {
    __shared__ float row[512];
    __shared__ float sh[32];
    long long t = blockIdx.x;
    int hh = blockIdx.y;
    int width = (H + 2 * KVH) * D;
    const float* src = qkv + t * width + (long long)hh * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = src[i];
        if (has_bias) v += wld(bias[hh * D + i]);
        row[i] = v;
    }
    __syncthreads();
    int kind = hh < H ? 0 : (hh < H + KVH ? 1 : 2);
    int p = pos[t];
    long long slot = (long long)tables[tab_off[t] + p / bs] * s_blk + (long long)(p % bs) * s_tok;
    if (kind == 2) {
        kt* dst = (kt*)v_plane + slot + (long long)(hh - H - KVH) * s_head;
        for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = kst(row[i]);
        return;
    }
    if (has_norm) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < D; i += blockDim.x) ss += row[i] * row[i];
        float inv = 1.0f / sqrtf(block_sum(ss, sh) / D + eps);
        const wt* nw = kind == 0 ? qn : kn;
        __syncthreads();
        for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = wld(nw[i]) * (row[i] * inv);
        __syncthreads();
    }
    int half = D / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c = cos_t[(long long)p * half + i], s = sin_t[(long long)p * half + i];
        float a = row[i], b = row[i + half];
        float o1 = a * c - b * s, o2 = b * c + a * s;
        if (kind == 0) {
            float* q = q_out + (t * H + hh) * D;
            q[i] = o1;
            q[i + half] = o2;
        } else {
            kt* dst = (kt*)k_plane + slot + (long long)(hh - H) * s_head;
            dst[i] = kst(o1);
            dst[i + half] = kst(o2);
        }
    }
}

#define MAXV 8     // head_dim <= 32 * MAXV
// WARPS (warps per attention block) is defined by the host, which launches 32 * WARPS threads.

// q · K[kr .. kr + D): with `vec`, rows start 16-byte aligned and D is a multiple of 16 bytes'
// worth of elements, so whole 16-byte words are read.
__device__ __forceinline__ float dot_row(const float* sq, const kt* kr, int D, int vec) {
    float a = 0.f;
    if (vec) {
#if KT == 0
        for (int i = 0; i < D; i += 4) {
            f32x4 w = *(const f32x4*)(kr + i);
            a += sq[i] * w.x + sq[i + 1] * w.y + sq[i + 2] * w.z + sq[i + 3] * w.w;
        }
#else
        for (int i = 0; i < D; i += 8) {
            u32x4 w = *(const u32x4*)(kr + i);
            unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                a += sq[i + 2 * e] * kld((u16)(u[e] & 0xffffu));
                a += sq[i + 2 * e + 1] * kld((u16)(u[e] >> 16));
            }
        }
#endif
        return a;
    }
    for (int i = 0; i < D; i++) a += sq[i] * kld(kr[i]);
    return a;
}

// Paged attention of one query (token, head) over its sequence's keys 0..pos (causal), read
// from the cache through the block table and the layout's strides; GQA maps head h to KV head
// h / (H / KVH). Each warp takes 32 keys at a time (every WARPS-th group of 32): lane j scores
// key j against the query (kept in shared memory), the warp's online softmax advances once per
// group, then the group's values accumulate with lanes over the head dimension. A group's key
// loads are independent of one another, so a sequence of `len` keys costs len / (32 · WARPS)
// dependent rounds — what bounds decoding long sequences. The warps' partial results are
// merged at the end. Grid (T, H), token blockIdx.x; with `use_toks`, (n, H) over the tokens
// listed in `toks` (the one-token chunks of a step whose longer chunks run `flash_prefill`).
extern "C" __global__ void attention(const float* q, unsigned long long k_plane, unsigned long long v_plane,
                                     const int* pos, const int* tab_off, const unsigned int* tables,
                                     const int* toks, int use_toks, int vec, int bs, long long s_blk,
                                     long long s_tok, long long s_head, wt* out, int H, int KVH, int D,
                                     float scale) {
    __shared__ float sq[32 * MAXV];
    __shared__ float sm[WARPS], sl[WARPS];
    __shared__ float sacc[WARPS][32 * MAXV];
    long long t = use_toks ? toks[blockIdx.x] : blockIdx.x;
    int h = blockIdx.y, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const kt* K = (const kt*)k_plane;
    const kt* V = (const kt*)v_plane;
    const float* qp = q + (t * H + h) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) sq[i] = qp[i] * scale;
    __syncthreads();
    float acc[MAXV];
#pragma unroll
    for (int u = 0; u < MAXV; u++) acc[u] = 0.f;
    float m = NEG_INF, l = 0.f;
    int len = pos[t] + 1;
    const unsigned int* tab = tables + tab_off[t];
    for (int j0 = warp * 32; j0 < len; j0 += WARPS * 32) {
        int j = j0 + lane;
        long long base = 0;
        float s = NEG_INF;
        if (j < len) {
            base = (long long)tab[j / bs] * s_blk + (long long)(j % bs) * s_tok + (long long)kh * s_head;
            s = dot_row(sq, K + base, D, vec);
        }
        float mx = s;
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mn = fmaxf(m, mx);  // finite: lane 0's key (j0 < len) is valid
        float corr = expf(m - mn), pr = expf(s - mn);
        float ps = pr;
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * corr + ps;
#pragma unroll
        for (int u = 0; u < MAXV; u++) acc[u] *= corr;
        int cnt = min(32, len - j0);  // the same for the whole warp
#pragma unroll 4
        for (int jj = 0; jj < cnt; jj++) {
            float pj = __shfl_sync(0xffffffffu, pr, jj);
            long long bj = __shfl_sync(0xffffffffu, base, jj);
#pragma unroll
            for (int u = 0; u < MAXV; u++) {
                int i = lane + 32 * u;
                if (i < D) acc[u] += pj * kld(V[bj + i]);
            }
        }
        m = mn;
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int u = 0; u < MAXV; u++) {
        int i = lane + 32 * u;
        if (i < D) sacc[warp][i] = acc[u];
    }
    __syncthreads();
    if (warp != 0) return;
    float M = NEG_INF;
    for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.f, f[WARPS];
    for (int w = 0; w < WARPS; w++) {
        f[w] = sl[w] > 0.f ? expf(sm[w] - M) : 0.f;  // a warp with no keys adds nothing
        L += sl[w] * f[w];
    }
    for (int i = lane; i < D; i += 32) {
        float o = 0.f;
        for (int w = 0; w < WARPS; w++) o += sacc[w][i] * f[w];
        out[(t * H + h) * D + i] = wst(o / L);
    }
}

// out[t][i] = SiLU(gu[t][i]) * gu[t][I + i]. grid-stride over T * I.
extern "C" __global__ void silu_mul(const float* gu, wt* out, int I, long long n) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        long long t = idx / I;
        long long i = idx - t * I;
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        out[idx] = wst(g / (1.0f + expf(-g)) * u);
    }
}
