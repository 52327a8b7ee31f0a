// The native engine's forward pass on NVIDIA GPUs, compiled at run time with NVRTC.
//
// The host prepends `#define WT n` (weights and matmul inputs) and `#define KT n` (KV cache),
// n = 0 f32, 1 f16, 2 bf16. Everything accumulates in f32; the residual stream, the matmul inputs
// and outputs and the cache are stored in the narrow types, as PyTorch models keep them (the
// residual stream in the weights' dtype: each add rounds, and the norms read half the bytes an f32
// stream would take). No #includes: 16-bit types are converted by hand.

typedef unsigned short u16;
#define NEG_INF __int_as_float(0xff800000)
// Every kernel passes here before it touches memory an earlier kernel writes or reads: most
// as they start, `gemv` once its first weights are asked for. In a decode graph on Hopper or
// later a kernel may be launched while the one before it is still running (programmatic edges,
// graphs/captured.rs); this waits until that kernel has finished and its writes are visible,
// then lets the kernel after this one be placed (which matters where the driver gives the
// programmatic port rather than the launch order one). Launched the ordinary way both return
// at once; before sm_90 it is nothing.
#if __CUDA_ARCH__ >= 900
#define GRID_DEP_WAIT() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_DEP_WAIT()
#endif
// 16- and 8-byte words, for whole-word loads of aligned rows.
struct alignas(16) u32x4 { unsigned int x, y, z, w; };
struct alignas(16) f32x4 { float x, y, z, w; };
struct alignas(8) u32x2 { unsigned int x, y; };

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

// Four consecutive values of the weights' dtype, from and to an 8- (16-bit) or 16-byte
// (f32) aligned address.
__device__ __forceinline__ void wld4(const wt* p, float* v) {
#if WT == 0
    f32x4 a = *(const f32x4*)p;
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
#else
    u32x2 a = *(const u32x2*)p;
    v[0] = wld((u16)(a.x & 0xffffu)), v[1] = wld((u16)(a.x >> 16));
    v[2] = wld((u16)(a.y & 0xffffu)), v[3] = wld((u16)(a.y >> 16));
#endif
}
__device__ __forceinline__ void wst4(wt* p, const float* v) {
#if WT == 0
    *(f32x4*)p = f32x4{v[0], v[1], v[2], v[3]};
#else
    *(u32x2*)p = u32x2{(unsigned int)wst(v[0]) | ((unsigned int)wst(v[1]) << 16),
                       (unsigned int)wst(v[2]) | ((unsigned int)wst(v[3]) << 16)};
#endif
}

// Rows of the model's hidden size HID (defined by the host), in blocks of 256 threads: with
// HID a multiple of 4 and at most 8,192, a thread's part of a row is ROW_VECS accesses of four
// values, which the row kernels below hold in registers at once, so a row costs one round trip
// to memory rather than one per access (a decode step runs one block a row).
#ifndef HID
#define HID 0  // unknown here: the kernels' loops
#endif
#define ROW_VECS ((HID % 4 == 0 && HID <= 8192) ? (HID + 1023) / 1024 : 0)

// x[t] = embed[ids[t]] (the residual stream, in the weights' dtype). grid (T), block 256.
extern "C" __global__ void embed(const unsigned int* ids, const wt* __restrict__ emb, wt* __restrict__ x,
                                 int hid) {
    GRID_DEP_WAIT();
    long long t = blockIdx.x;
    const wt* e = emb + (long long)ids[t] * hid;
    wt* xt = x + t * hid;
    if ((hid & 3) == 0) {
        for (int i = threadIdx.x * 4; i < hid; i += blockDim.x * 4) {
            float v[4];
            wld4(e + i, v);
            wst4(xt + i, v);
        }
        return;
    }
    for (int i = threadIdx.x; i < hid; i += blockDim.x) xt[i] = e[i];
}

// out[r] = RMSNorm(x[src]) * w, src = rows ? rows[r] : r: the products before a norm add into
// the residual stream x themselves. grid (rows), block 256. With `hid` a multiple of 4 (rows on
// 16-byte boundaries) each thread takes 4 consecutive values per access: a prompt's norms stream
// its whole residual stream. For the model's hidden size HID each thread's ROW_VECS accesses of
// x and the weight are all loaded before any is used: a decode step's norm is one block a row,
// whose time is the round trips to memory. Registers are sized by HID, so a prompt's many rows
// keep enough blocks an SM to stream at memory speed. The `_norm` products (`gemv.cu`) sum the
// same values in the same order.
extern "C" __global__ void rmsnorm(const wt* __restrict__ x, const int* rows, int use_rows, const wt* __restrict__ w,
                                   wt* __restrict__ out, int hid, float eps) {
    GRID_DEP_WAIT();
    __shared__ float sh[32];
    long long r = blockIdx.x;
    long long src = use_rows ? rows[r] : r;
    const wt* xr = x + src * hid;
    wt* orow = out + r * hid;
    float ss = 0.f;
#if ROW_VECS > 0
    if (hid == HID && blockDim.x == 256) {
        float a[ROW_VECS][4], wv[ROW_VECS][4];
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < hid) {
                wld4(xr + i, a[k]);
                wld4(w + i, wv[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < hid) ss += a[k][0] * a[k][0] + a[k][1] * a[k][1] + a[k][2] * a[k][2] + a[k][3] * a[k][3];
        }
        float inv = 1.0f / sqrtf(block_sum(ss, sh) / hid + eps);
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            int i = (threadIdx.x + k * 256) * 4;
            if (i < hid) {
                float o[4];
                o[0] = wv[k][0] * (a[k][0] * inv), o[1] = wv[k][1] * (a[k][1] * inv),
                o[2] = wv[k][2] * (a[k][2] * inv), o[3] = wv[k][3] * (a[k][3] * inv);
                wst4(orow + i, o);
            }
        }
        return;
    }
#endif
    if ((hid & 3) == 0) {
        for (int i = threadIdx.x * 4; i < hid; i += blockDim.x * 4) {
            float a[4];
            wld4(xr + i, a);
            ss += a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3];
        }
        float inv = 1.0f / sqrtf(block_sum(ss, sh) / hid + eps);
        for (int i = threadIdx.x * 4; i < hid; i += blockDim.x * 4) {
            float a[4], wv[4], o[4];
            wld4(xr + i, a);
            wld4(w + i, wv);
#pragma unroll
            for (int j = 0; j < 4; j++) o[j] = wv[j] * (a[j] * inv);
            wst4(orow + i, o);
        }
        return;
    }
    for (int i = threadIdx.x; i < hid; i += blockDim.x) {
        float v = wld(xr[i]);
        ss += v * v;
    }
    float inv = 1.0f / sqrtf(block_sum(ss, sh) / hid + eps);
    for (int i = threadIdx.x; i < hid; i += blockDim.x) orow[i] = wst(wld(w[i]) * (wld(xr[i]) * inv));
}

// Eight consecutive values of the weights' dtype from a 16-byte aligned address, as f32.
__device__ __forceinline__ void wld8(const wt* p, float* v) {
    wld4(p, v);
    wld4(p + 4, v + 4);
}
// Eight values of the cache's dtype from a 16-byte aligned address, as f32.
__device__ __forceinline__ void kld8(const kt* p, float* v) {
#if KT == 0
    f32x4 a = *(const f32x4*)p, b = *(const f32x4*)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
#else
    u32x4 w = *(const u32x4*)p;
    unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; j++) v[2 * j] = kld((u16)(u[j] & 0xffffu)), v[2 * j + 1] = kld((u16)(u[j] >> 16));
#endif
}
// Eight values into the cache's dtype: whole words where `p` is 16-byte aligned (every layout's
// rows are, but a layout's strides are not checked here), else one by one.
__device__ __forceinline__ void kst8(kt* p, const float* v) {
    if (((unsigned long long)p & 15) != 0) {
#pragma unroll
        for (int j = 0; j < 8; j++) p[j] = kst(v[j]);
        return;
    }
#if KT == 0
    *(f32x4*)p = f32x4{v[0], v[1], v[2], v[3]};
    *(f32x4*)(p + 4) = f32x4{v[4], v[5], v[6], v[7]};
#else
    *(u32x4*)p = u32x4{(unsigned int)kst(v[0]) | ((unsigned int)kst(v[1]) << 16),
                       (unsigned int)kst(v[2]) | ((unsigned int)kst(v[3]) << 16),
                       (unsigned int)kst(v[4]) | ((unsigned int)kst(v[5]) << 16),
                       (unsigned int)kst(v[6]) | ((unsigned int)kst(v[7]) << 16)};
#endif
}

#if HD % 64 == 0 && HD <= 512
#define QKV_TPH (HD / 16)  // threads a head: each takes 8 elements of each half of it
#endif

#ifdef QKV_TPH
// A thread's RoPE factors at position p for elements c .. c + 7 of a head's first half (the
// tables made at load: cos and sin, HD / 2 a position).
__device__ __forceinline__ void rope_factors(const float* cos_t, const float* sin_t, int p, int c, float* rc,
                                             float* rs) {
    const float* cp = cos_t + (long long)p * (HD / 2) + c;
    const float* sp = sin_t + (long long)p * (HD / 2) + c;
    f32x4 c0 = *(const f32x4*)cp, c1 = *(const f32x4*)(cp + 4);
    f32x4 s0 = *(const f32x4*)sp, s1 = *(const f32x4*)(sp + 4);
    rc[0] = c0.x, rc[1] = c0.y, rc[2] = c0.z, rc[3] = c0.w, rc[4] = c1.x, rc[5] = c1.y, rc[6] = c1.z, rc[7] = c1.w;
    rs[0] = s0.x, rs[1] = s0.y, rs[2] = s0.z, rs[3] = s0.w, rs[4] = s1.x, rs[5] = s1.y, rs[6] = s1.z, rs[7] = s1.w;
}

// A thread's part of head `hh` (of kind 0 Q, 1 K, 2 V) of a token's QKV row `row`: elements
// c .. c + 7 of the head's first half into o1 and the 8 they pair with in RoPE into o2, after the
// bias, the per-head RMSNorm with weights `nw` (Q and K) and RoPE by the factors rc, rs (Q and
// K). The head's QKV_TPH threads must be neighbouring lanes, QKV_TPH-aligned, all here with the
// same head: the norm sums over them. `qkv_post` and the decode attention that takes its place
// in decode steps (`flash_decode_qkv`) both call this, so both write the same bits.
__device__ __forceinline__ void qkv_head_part(const wt* row, int hh, int kind, const wt* bias, int has_bias,
                                              const wt* nw, int has_norm, int c, const float* rc,
                                              const float* rs, float eps, float* o1, float* o2) {
    const int half = HD / 2;
    const wt* src = row + (long long)hh * HD;
    float a[8], b[8];
    wld8(src + c, a);
    wld8(src + half + c, b);
    if (has_bias) {
        float ba[8], bb[8];
        wld8(bias + hh * HD + c, ba);
        wld8(bias + hh * HD + half + c, bb);
#pragma unroll
        for (int j = 0; j < 8; j++) a[j] += ba[j], b[j] += bb[j];
    }
    if (kind == 2) {
#pragma unroll
        for (int j = 0; j < 8; j++) o1[j] = a[j], o2[j] = b[j];
        return;
    }
    if (has_norm) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) ss += a[j] * a[j] + b[j] * b[j];
        int lane = threadIdx.x & 31;
        unsigned int mask = QKV_TPH == 32 ? 0xffffffffu : ((1u << QKV_TPH) - 1) << (lane & ~(QKV_TPH - 1));
        for (int o = QKV_TPH / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(mask, ss, o);
        float inv = 1.0f / sqrtf(ss / HD + eps);
        float wa[8], wb[8];
        wld8(nw + c, wa);
        wld8(nw + half + c, wb);
#pragma unroll
        for (int j = 0; j < 8; j++) a[j] = wa[j] * (a[j] * inv), b[j] = wb[j] * (b[j] * inv);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        o1[j] = a[j] * rc[j] - b[j] * rs[j];
        o2[j] = b[j] * rc[j] + a[j] * rs[j];
    }
}
#endif

// After the QKV projection: per head of Q, K and V of each token, the bias, per-head RMSNorm (Q,
// K), RoPE (Q, K); Q goes to q_out in the cache's dtype (what attention multiplies it in), K and V
// into the paged cache at the token's slot, found through the block table and the layout's strides
// (elements).
//
// Where HD is a multiple of 64 (up to 512), QKV_TPH neighbouring threads take a head, each 8
// elements of its first half and the 8 they pair with in RoPE, in 16-byte words: a token's heads
// are 8 words a thread in flight instead of a warp's 2-byte lanes, which is what kept the kernel at
// half the HBM's speed on long prompts. grid (T, ceil((H + 2 KVH) · QKV_TPH / block)), the block
// whole warps, at most 1,024 threads (`forward::qkv_post_grid`). Other head sizes: one warp per
// head, lanes over the head dimension, the row in shared memory for RoPE's pairs; grid (T, ceil((H
// + 2 KVH) / 8)), block 256.
extern "C" __global__ void qkv_post(const wt* qkv, const wt* bias, int has_bias, const wt* qn, const wt* kn,
                                    int has_norm, const float* cos_t, const float* sin_t, const int* pos,
                                    const int* tab_off, const unsigned int* tables, unsigned long long k_plane,
                                    unsigned long long v_plane, int bs, long long s_blk, long long s_tok,
                                    long long s_head, kt* q_out, int H, int KVH, float eps) {
#ifdef QKV_TPH
    int heads = H + 2 * KVH, half = HD / 2;
    long long t = blockIdx.x;
    int g = blockIdx.y * blockDim.x + threadIdx.x;
    int hh = g / QKV_TPH, c = g % QKV_TPH * 8;
    bool live = hh < heads;
    int kind = hh < H ? 0 : (hh < H + KVH ? 1 : 2);
    // The token's slot from the host's positions and block tables, which no kernel writes:
    // looked up before waiting on the kernel before this one (the QKV product); so are the
    // thread's RoPE factors, from the tables made at load.
    long long slot = 0;
    float rc[8], rs[8];
    if (live) {
        int p = pos[t];
        slot = (long long)tables[tab_off[t] + p / bs] * s_blk + (long long)(p % bs) * s_tok;
        rope_factors(cos_t, sin_t, p, c, rc, rs);
    }
    GRID_DEP_WAIT();
    if (!live) return;
    float o1[8], o2[8];
    qkv_head_part(qkv + t * (long long)(heads * HD), hh, kind, bias, has_bias, kind == 0 ? qn : kn, has_norm, c,
                  rc, rs, eps, o1, o2);
    kt* dst = kind == 0 ? q_out + (t * H + hh) * HD
                        : (kt*)(kind == 1 ? k_plane : v_plane) + slot + (long long)(hh - H - (kind - 1) * KVH) * s_head;
    kst8(dst + c, o1);
    kst8(dst + half + c, o2);
#else
    __shared__ float rows[8][HD];
    long long t = blockIdx.x;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int width = (H + 2 * KVH) * HD, half = HD / 2;
    // The token's slot from the host's positions and block tables, which no kernel writes:
    // looked up before waiting on the kernel before this one (the QKV product); so are the
    // lane's RoPE factors, from the tables made at load.
    int p = pos[t];
    long long slot = (long long)tables[tab_off[t] + p / bs] * s_blk + (long long)(p % bs) * s_tok;
    GRID_DEP_WAIT();
    float* row = rows[warp];
    for (int hh = blockIdx.y * 8 + warp; hh < H + 2 * KVH; hh += 8 * gridDim.y) {
        const wt* src = qkv + t * width + (long long)hh * HD;
        int kind = hh < H ? 0 : (hh < H + KVH ? 1 : 2);
        float ss = 0.f;
        for (int i = lane; i < HD; i += 32) {
            float v = wld(src[i]);
            if (has_bias) v += wld(bias[hh * HD + i]);
            row[i] = v;
            ss += v * v;
        }
        if (kind == 2) {
            kt* dst = (kt*)v_plane + slot + (long long)(hh - H - KVH) * s_head;
            for (int i = lane; i < HD; i += 32) dst[i] = kst(row[i]);
            continue;
        }
        if (has_norm) {
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            float inv = 1.0f / sqrtf(ss / HD + eps);
            const wt* nw = kind == 0 ? qn : kn;
            for (int i = lane; i < HD; i += 32) row[i] = wld(nw[i]) * (row[i] * inv);
        }
        __syncwarp();
        for (int i = lane; i < half; i += 32) {
            float c = cos_t[(long long)p * half + i], s = sin_t[(long long)p * half + i];
            float a = row[i], b = row[i + half];
            float o1 = a * c - b * s, o2 = b * c + a * s;
            if (kind == 0) {
                kt* q = q_out + (t * H + hh) * HD;
                q[i] = kst(o1);
                q[i + half] = kst(o2);
            } else {
                kt* dst = (kt*)k_plane + slot + (long long)(hh - H) * s_head;
                dst[i] = kst(o1);
                dst[i + half] = kst(o2);
            }
        }
        __syncwarp();  // the row is rewritten for the next head
    }
#endif
}

#define NV ((HD + 31) / 32)  // head elements per lane
// WARPS (warps per attention block), GB (query heads per block: a divisor of the GQA group
// H / KVH, at most 8) and MAX_SPLITS (most blocks sharing one query's keys) are defined by the
// host, which launches 32 * WARPS threads.

// s[g] += q_g · K[kr .. kr + HD) for the block's G query heads: the key row is read once for
// all of them. With `vec`, rows start 16-byte aligned and hold whole 16-byte words.
template <int G>
__device__ __forceinline__ void dot_rows(const float (*sq)[HD], const kt* kr, int vec, float* s) {
    if (vec) {
#if KT == 0
#pragma unroll
        for (int i = 0; i < HD; i += 4) {
            f32x4 w = *(const f32x4*)(kr + i);
#pragma unroll
            for (int g = 0; g < G; g++) {
                f32x4 a = *(const f32x4*)(&sq[g][i]);
                s[g] += a.x * w.x + a.y * w.y + a.z * w.z + a.w * w.w;
            }
        }
#else
#pragma unroll
        for (int i = 0; i < HD; i += 8) {
            float k[8];
            kld8(kr + i, k);
#pragma unroll
            for (int g = 0; g < G; g++) {
                f32x4 a = *(const f32x4*)(&sq[g][i]), b = *(const f32x4*)(&sq[g][i + 4]);
                s[g] += a.x * k[0] + a.y * k[1] + a.z * k[2] + a.w * k[3] + b.x * k[4] + b.y * k[5] + b.z * k[6] +
                        b.w * k[7];
            }
        }
#endif
        return;
    }
    for (int i = 0; i < HD; i++) {
        float k = kld(kr[i]);
#pragma unroll
        for (int g = 0; g < G; g++) s[g] += sq[g][i] * k;
    }
}

// acc[g] += p_g,jj · V[key j0 + jj] for the block's heads, lanes over the head dimension; `blk`
// and `pr` are lane jj's block and probabilities. The value row is read once for all heads.
template <int G>
__device__ __forceinline__ void add_value(float (*acc)[NV], const kt* V, unsigned int blk, const float* pr,
                                          int j0, int jj, int bs, long long s_blk, long long s_tok,
                                          long long head_off, int lane) {
    unsigned int bj = __shfl_sync(0xffffffffu, blk, jj);
    const kt* vr = V + (long long)bj * s_blk + (long long)((j0 + jj) % bs) * s_tok + head_off;
    float v[NV];
#pragma unroll
    for (int u = 0; u < NV; u++) {
        int i = lane + 32 * u;
        v[u] = i < HD ? kld(vr[i]) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        float pj = __shfl_sync(0xffffffffu, pr[g], jj);
#pragma unroll
        for (int u = 0; u < NV; u++) acc[g][u] += pj * v[u];
    }
}

// add_value for the `cnt` keys of a group: fully unrolled when the group is whole, so all its
// value loads are in flight at once.
template <int G>
__device__ __forceinline__ void add_values(float (*acc)[NV], const kt* V, unsigned int blk, const float* pr,
                                           int j0, int cnt, int bs, long long s_blk, long long s_tok,
                                           long long head_off, int lane) {
    if (cnt == 32) {
#pragma unroll
        for (int jj = 0; jj < 32; jj++) add_value<G>(acc, V, blk, pr, j0, jj, bs, s_blk, s_tok, head_off, lane);
        return;
    }
    for (int jj = 0; jj < cnt; jj++) add_value<G>(acc, V, blk, pr, j0, jj, bs, s_blk, s_tok, head_off, lane);
}

// The end of a query's split attention, run by every block of it after writing its partial
// (max in natural-log units, sum, unnormalised output per head: `part`'s rows of HD + 2): the last
// split of the query to get here merges everyone's partials into `out`. Each block's writes
// are released before its count, and the last block acquires them all after reading it; it
// sets the count back to 0 for the next launch. Grid (query slots, head blocks, splits); the
// block serves slot `slot` (token t), whose `splits` (≤ MAX_SPLITS) blocks take part; the
// block's G heads start at h0. A slot's partials are `part`'s rows MAX_SPLITS apart per head.
template <int G>
__device__ __forceinline__ void merge_splits(const float* part, unsigned int* counters, wt* out, long long t,
                                             long long slot, int h0, int H, int splits) {
    __shared__ float pm[G][MAX_SPLITS], pl[G][MAX_SPLITS];
    __shared__ int last;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int* c = counters + slot * gridDim.y + blockIdx.y;
        last = atomicAdd(c, 1u) == (unsigned int)(splits - 1);
        if (last) *c = 0u;  // every split has counted: ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    // Every split's max and sum at once into shared memory (one load per thread), then each
    // (head, element) reads all splits' outputs with its loads in flight together.
    for (int e = threadIdx.x; e < G * splits; e += blockDim.x) {
        int g = e / splits, zz = e % splits;
        const float* pz = part + (((slot * H + h0 + g) * MAX_SPLITS) + zz) * (HD + 2);
        pm[g][zz] = __ldcg(pz);
        pl[g][zz] = __ldcg(pz + 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        int g = e / HD, i = e % HD;
        long long h = h0 + g;
        const float* pp = part + ((slot * H + h) * MAX_SPLITS) * (HD + 2) + 2 + i;
        float v[MAX_SPLITS];
#pragma unroll
        for (int zz = 0; zz < MAX_SPLITS; zz++) v[zz] = zz < splits ? __ldcg(pp + zz * (HD + 2)) : 0.f;
        float M = NEG_INF;
        for (int zz = 0; zz < splits; zz++) M = fmaxf(M, pm[g][zz]);
        float L = 0.f, o = 0.f;
#pragma unroll
        for (int zz = 0; zz < MAX_SPLITS; zz++) {
            float f = zz < splits && pl[g][zz] > 0.f ? expf(pm[g][zz] - M) : 0.f;  // no keys, no weight
            L += (zz < splits ? pl[g][zz] : 0.f) * f;
            o += v[zz] * f;
        }
        out[(t * H + h) * HD + i] = wst(o / L);
    }
}

// The end of a query's attention in a block of NW warps, each of which left its (max in
// natural-log units, sum, unnormalised output) per head in shared memory: merged one (head,
// element) per thread into `out`, or with several splits (this is split z of `splits` of slot
// `slot`) into this split's partial and then by merge_splits.
template <int G, int NW>
__device__ __forceinline__ void merge_warps(const float (*sm)[G], const float (*sl)[G], const float (*sacc)[G][HD],
                                            float* part, unsigned int* counters, wt* out, long long t,
                                            long long slot, int z, int h0, int H, int splits) {
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        int g = e / HD, i = e % HD;
        float M = NEG_INF;
        for (int w = 0; w < NW; w++) M = fmaxf(M, sm[w][g]);
        float L = 0.f, o = 0.f;
        for (int w = 0; w < NW; w++) {
            float f = sl[w][g] > 0.f ? expf(sm[w][g] - M) : 0.f;  // a warp with no keys adds nothing
            L += sl[w][g] * f;
            o += sacc[w][g][i] * f;
        }
        long long h = h0 + g;
        if (splits == 1) {
            out[(t * H + h) * HD + i] = wst(o / L);
            continue;
        }
        float* pp = part + ((slot * H + h) * MAX_SPLITS + z) * (HD + 2);
        if (i == 0) {
            pp[0] = M;
            pp[1] = L;
        }
        pp[2 + i] = o;
    }
    if (splits > 1) merge_splits<G>(part, counters, out, t, slot, h0, H, splits);
}

// Paged attention of one query token for G heads that share one KV head (GQA), over its
// sequence's keys 0..pos (causal), read from the cache through the block table and the
// layout's strides. Each key and value row is read once for the G heads. Keys go in groups
// of 32: lane j scores key j against the queries (kept in shared memory), the warp's online
// softmaxes advance once per group, then the group's values accumulate with lanes over the
// head dimension — a group's loads are independent of one another. The groups are dealt round
// robin to the `splits` blocks of a query (blockIdx.z) and the WARPS warps of each, so a long
// sequence is walked by many warps at once even when a step has few queries (decoding one
// sequence); the warps' partial results are merged at the end. With several splits each block
// writes its partial (max, sum, unnormalised output per head) to `part`, and the last block of
// a query to finish (counted in `counters`, which it sets back to 0 for the next launch) merges
// them into the output. Grid (T, H / G, splits), token blockIdx.x; with `use_toks`,
// (n, H / G, splits) over the tokens listed in `toks` (the one-token chunks of a step whose
// longer chunks run `flash_prefill`).
template <int G>
__device__ __forceinline__ void attention_heads(const kt* q, unsigned long long k_plane,
                                                unsigned long long v_plane, const int* pos, const int* tab_off,
                                                const unsigned int* tables, const int* toks, int use_toks, int vec,
                                                int bs, long long s_blk, long long s_tok, long long s_head, wt* out,
                                                float* part, unsigned int* counters, int H, int KVH, float scale) {
    __shared__ __align__(16) float sq[G][HD];
    __shared__ float sm[WARPS][G], sl[WARPS][G];
    __shared__ float sacc[WARPS][G][HD];
    long long t = use_toks ? toks[blockIdx.x] : blockIdx.x;
    int h0 = blockIdx.y * G, kh = h0 / (H / KVH);
    int z = blockIdx.z, splits = gridDim.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const kt* K = (const kt*)k_plane;
    const kt* V = (const kt*)v_plane;
    const kt* qp = q + (t * H + h0) * HD;  // the G heads' rows are consecutive
    int len = pos[t] + 1;
    const unsigned int* tab = tables + tab_off[t];
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) sq[i / HD][i % HD] = kld(qp[i]) * scale;
    __syncthreads();
    float acc[G][NV], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int u = 0; u < NV; u++) acc[g][u] = 0.f;
    }
    long long head_off = (long long)kh * s_head;
    for (int gi = z + splits * warp; gi * 32 < len; gi += splits * WARPS) {
        int j0 = gi * 32, j = j0 + lane;
        unsigned int blk = 0;
        float s[G], pr[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = 0.f;
        if (j < len) {
            blk = tab[j / bs];
            dot_rows<G>(sq, K + (long long)blk * s_blk + (long long)(j % bs) * s_tok + head_off, vec, s);
        } else {
#pragma unroll
            for (int g = 0; g < G; g++) s[g] = NEG_INF;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = s[g];
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mn = fmaxf(m[g], mx);  // finite: lane 0's key (j0 < len) is valid
            float corr = expf(m[g] - mn);
            pr[g] = expf(s[g] - mn);
            float ps = pr[g];
            for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[g] = l[g] * corr + ps;
#pragma unroll
            for (int u = 0; u < NV; u++) acc[g][u] *= corr;
            m[g] = mn;
        }
        add_values<G>(acc, V, blk, pr, j0, min(32, len - j0), bs, s_blk, s_tok, head_off, lane);
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
#pragma unroll
        for (int u = 0; u < NV; u++) {
            int i = lane + 32 * u;
            if (i < HD) sacc[warp][g][i] = acc[g][u];
        }
    }
    __syncthreads();
    merge_warps<G, WARPS>(sm, sl, sacc, part, counters, out, t, blockIdx.x, blockIdx.z, h0, H, gridDim.z);
}

// The kernel for steps with many queries: blocks of the GB heads of a KV head, each K/V row
// read once for all of them (the reads that bound a large batch).
extern "C" __global__ void attention(const kt* q, unsigned long long k_plane, unsigned long long v_plane,
                                     const int* pos, const int* tab_off, const unsigned int* tables,
                                     const int* toks, int use_toks, int vec, int bs, long long s_blk,
                                     long long s_tok, long long s_head, wt* out, float* part,
                                     unsigned int* counters, int H, int KVH, float scale) {
    GRID_DEP_WAIT();
    attention_heads<GB>(q, k_plane, v_plane, pos, tab_off, tables, toks, use_toks, vec, bs, s_blk, s_tok, s_head,
                        out, part, counters, H, KVH, scale);
}

// The kernel for steps with few queries (decoding a few sequences): a block per head, so the
// key walks are spread over GB times as many warps (the time is each warp's chain of loads).
extern "C" __global__ void attention_one(const kt* q, unsigned long long k_plane, unsigned long long v_plane,
                                         const int* pos, const int* tab_off, const unsigned int* tables,
                                         const int* toks, int use_toks, int vec, int bs, long long s_blk,
                                         long long s_tok, long long s_head, wt* out, float* part,
                                         unsigned int* counters, int H, int KVH, float scale) {
    GRID_DEP_WAIT();
    attention_heads<1>(q, k_plane, v_plane, pos, tab_off, tables, toks, use_toks, vec, bs, s_blk, s_tok, s_head,
                       out, part, counters, H, KVH, scale);
}

// SiLU(g) · u of two 16-bit values packed in a word each, packed the same way.
__device__ __forceinline__ unsigned int silu_mul2(unsigned int g, unsigned int u) {
    float g0 = wld((u16)(g & 0xffffu)), g1 = wld((u16)(g >> 16));
    float r0 = g0 / (1.0f + expf(-g0)) * wld((u16)(u & 0xffffu));
    float r1 = g1 / (1.0f + expf(-g1)) * wld((u16)(u >> 16));
    return (unsigned int)wst(r0) | ((unsigned int)wst(r1) << 16);
}

// out[t][i] = SiLU(gu[t][i]) * gu[t][I + i], the gate/up projection in the weights' dtype.
// grid (T, ceil(I / 2048)), block 256. With 16-bit weights and I a multiple of 8 (rows on
// 16-byte boundaries) each thread takes 8 consecutive elements in one 16-byte word of each
// input: the kernel streams a prompt's whole gate/up output, and 2-byte accesses left it far
// from the memory's speed. Otherwise 8 elements 256 apart (coalesced, no division per element).
extern "C" __global__ void silu_mul(const wt* gu, wt* out, int I) {
    GRID_DEP_WAIT();
    long long t = blockIdx.x;
    const wt* g = gu + t * 2 * I;
    const wt* u = g + I;
#if WT != 0
    if ((I & 7) == 0) {
        int i = (blockIdx.y * 256 + threadIdx.x) * 8;
        if (i < I) {
            u32x4 a = *(const u32x4*)(g + i), b = *(const u32x4*)(u + i), r;
            r.x = silu_mul2(a.x, b.x);
            r.y = silu_mul2(a.y, b.y);
            r.z = silu_mul2(a.z, b.z);
            r.w = silu_mul2(a.w, b.w);
            *(u32x4*)(out + t * I + i) = r;
        }
        return;
    }
#endif
#pragma unroll
    for (int e = 0; e < 8; e++) {
        int i = blockIdx.y * 2048 + e * 256 + threadIdx.x;
        if (i < I) {
            float x = wld(g[i]);
            out[t * I + i] = wst(x / (1.0f + expf(-x)) * wld(u[i]));
        }
    }
}

// out[r] = the index of the largest of logits[r][0..vocab): the first of equals, NaN never
// chosen, 0 when nothing beats -inf — the CPU sampler's greedy choice. grid (rows), block 1024.
extern "C" __global__ void argmax_rows(const float* logits, int vocab, unsigned int* out) {
    GRID_DEP_WAIT();
    __shared__ float sv[32];
    __shared__ unsigned int si[32];
    const float* row = logits + (long long)blockIdx.x * vocab;
    float bv = NEG_INF;
    unsigned int bi = 0xffffffffu;
    if ((vocab & 3) == 0) {
        // Rows of whole 16-byte words: each thread keeps four of them in flight, where one load
        // at a time left a 150k-word row latency-bound (50 µs). A thread still visits its
        // values in increasing index order, so equals keep the first.
        const f32x4* r4 = (const f32x4*)row;
        int words = vocab >> 2, nt = blockDim.x;
        for (int i = threadIdx.x; i < words; i += 4 * nt) {
            f32x4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (i + u * nt < words) v[u] = r4[i + u * nt];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (i + u * nt >= words) break;
                unsigned int b = 4u * (unsigned int)(i + u * nt);
                float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (e[j] > bv) {  // false for NaN
                        bv = e[j];
                        bi = b + j;
                    }
            }
        }
    } else {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float x = row[i];
            if (x > bv) {  // false for NaN; the first of equals within this thread's stride
                bv = x;
                bi = i;
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, bv, o);
        unsigned int j = __shfl_xor_sync(0xffffffffu, bi, o);
        if (v > bv || (v == bv && j < bi)) {
            bv = v;
            bi = j;
        }
    }
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < nw; k++)
            if (sv[k] > bv || (sv[k] == bv && si[k] < bi)) {
                bv = sv[k];
                bi = si[k];
            }
        out[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
    }
}
