// Decode attention on tensor cores: one query token against its sequence's keys, the GQ query
// heads sharing a KV head (GQA) served by one walk over its keys, so every K and V row is read
// once for all of them and scores and outputs come from mma.sync instead of a shuffle per head
// per key. Grid (queries, KVH, splits) — token blockIdx.x, or the one listed in `toks` with
// `use_toks` — block 32 · DW. The keys go in tiles of DK dealt round robin to the splits'
// warps; a warp loads its tile's K and V straight from the cache into registers (no shared
// memory, no block-wide barrier in the loop). Its tiles are double-buffered in registers: the
// next tile's K and V rows load while this tile's scores and outputs are worked out, and the
// row offsets of the tile after that (a block-table read) with them, so a warp keeps loads in
// flight the whole walk instead of waiting on memory at every tile.
//
// Two forms of the m16n8k16 tiles, by group size:
// - up to 8 heads (`KeyRows`): the keys are the tile's 16 rows and the heads its 8 columns,
//   S^T = K · Q^T and O^T = V^T · P^T. A group of 4 then fills half the columns instead of a
//   quarter of 16 rows, and the output accumulators are half as many (heads of 128: 220
//   registers with two tiles in registers, where heads as rows took 199 with one). P^T's
//   fragments are S^T's accumulators transposed in registers (`movmatrix`);
// - 9 to 16 heads (`HeadRows`): the heads are the rows, S = Q · K^T and O = P · V, P's
//   fragments straight from S's accumulators, as in flash_prefill.
// Operands are read in a permuted but consistent order, so every load is a whole row segment:
// lane (g, tq) loads elements [tq·HD/4, (tq+1)·HD/4) of keys g and g + 8 of each 16 for the
// scores, Q's fragments take the same elements (the dot products are the same sums over a
// permuted head dimension), and elements [g·HD/8, (g+1)·HD/8) of keys 2tq, 2tq+1, 2tq+8 and
// 2tq+9 for P·V, paired across keys with byte permutes; the output's columns come out permuted
// the same way, and each form writes them back in order.
//
// Each warp's (max, sum, output) meet in shared memory; with several splits the last block of a
// query merges all partials (merge_splits, natural-log maxima). The grid is sized from the
// step's shape (queries × KVH × splits, which a graph replays whatever the lengths), and the
// host deals each KV head's queries × splits blocks to the queries by length every step
// (`plan::deal_decode_blocks`): a serving batch mixes contexts of 40 and 2,833 tokens, and as
// many splits for each would leave the step waiting on the longest one's blocks. Entry
// blockIdx.z · gridDim.x + blockIdx.x of `deal` is the block's (query slot << 8 | split << 4 |
// splits − 1), or −1 for a block with no work, which returns at once. Its arguments are
// `attention`'s (`vec` unused: the host runs it on caches whose rows are whole aligned words),
// then `deal`, but for the scale, log2(e) / sqrt(HD) as in flash_prefill.

#if KT != 0 && HD % 16 == 0 && HD <= 128 && __CUDA_ARCH__ >= 800 && GQ <= 16
#define DW 4                    // warps per flash_decode block
// DK, the keys of a warp's tile (its K and V segments stay in registers), is the host's
// (`plan::decode_tile_keys`), as the deal of the blocks counts tiles of it.
#define KWORDS (HD / 8)         // words of a lane's K row segment (HD/4 elements)
#define VWORDS (HD / 16)        // words of a lane's V row segment (HD/8 elements)
#define LN2F 0.6931471805599453f  // ln 2: the merges' maxima are in natural-log units

// N 32-bit words from p in the widest aligned loads: 16 bytes where N is a multiple of 4 (the
// segment then starts on a 16-byte boundary), else 8, else 4.
template <int N>
__device__ __forceinline__ void load_words(const kt* p, unsigned int* w) {
    if (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            u32x4 v = ((const u32x4*)p)[i];
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            u32x2 v = ((const u32x2*)p)[i];
            w[2 * i] = v.x, w[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = ((const unsigned int*)p)[i];
    }
}

// Lane `src`'s 64-bit value.
__device__ __forceinline__ long long shfl64(long long v, int src) {
    int lo = __shfl_sync(0xffffffffu, (int)(v & 0xffffffffll), src);
    int hi = __shfl_sync(0xffffffffu, (int)(v >> 32), src);
    return ((long long)hi << 32) | (unsigned int)lo;
}

// One tile's K and V segments of lane (g, tq), from `off`: lane L's key's row offset (the
// others' by shuffle).
__device__ __forceinline__ void load_tile(const kt* K, const kt* V, long long off, int g, int tq,
                                          unsigned int (*kw)[KWORDS], unsigned int (*vw)[4][VWORDS]) {
#pragma unroll
    for (int nt = 0; nt < DK / 8; nt++) load_words<KWORDS>(K + shfl64(off, nt * 8 + g), kw[nt]);
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) {
#pragma unroll
        for (int r = 0; r < 4; r++)
            load_words<VWORDS>(V + shfl64(off, kk * 16 + 2 * tq + (r & 1) + (r >> 1) * 8), vw[kk][r]);
    }
}

#if GQ <= 8
// The 8×8 16-bit matrix of a warp's fragments (lane 4r + c holding row r, columns 2c and
// 2c + 1), transposed.
__device__ __forceinline__ unsigned int trans8(unsigned int x) {
    unsigned int y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

// Keys as rows, heads as columns (lane (g, tq) holds heads 2tq and 2tq + 1 of its columns).
struct KeyRows {
    unsigned int qb[HD / 16][2];  // Q^T's B fragments: column g is head g (0 past GQ)
    // O^T: m-tile mt's rows g and g + 8 are head elements g·HD/8 + 2mt and + 1.
    float o[HD / 16][4];
    float m0, m1, l0, l1;  // heads 2tq, 2tq + 1: running maxima (base 2) and this lane's sums

    // `q0`: the group's first head's query row.
    __device__ __forceinline__ void init(const kt* q0, int g, int tq, float scale) {
        const kt* qg = q0 + g * HD + tq * (HD / 4);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (g < GQ) a[e] = kld(qg[4 * kk + e]) * scale;
            qb[kk][0] = pack2(a[0], a[1]);
            qb[kk][1] = pack2(a[2], a[3]);
        }
#pragma unroll
        for (int d = 0; d < HD / 16; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
        m0 = m1 = NEG_INF, l0 = l1 = 0.f;
    }

    // The tile of keys key0.. (those from `len` on masked).
    __device__ __forceinline__ void tile(const unsigned int (*kw)[KWORDS], const unsigned int (*vw)[4][VWORDS],
                                         int key0, int len, int g, int tq) {
        // S^T, 16 keys at a time: lane (g, tq) gets keys g and g + 8 of heads 2tq and 2tq + 1.
        float s[DK / 16][4];
#pragma unroll
        for (int h = 0; h < DK / 16; h++) {
            s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                unsigned int a[4] = {kw[2 * h][2 * kk], kw[2 * h + 1][2 * kk], kw[2 * h][2 * kk + 1],
                                     kw[2 * h + 1][2 * kk + 1]};
                mma16816(s[h], a, qb[kk][0], qb[kk][1]);
            }
        }
        if (key0 + DK > len) {
#pragma unroll
            for (int h = 0; h < DK / 16; h++) {
                int j = key0 + 16 * h + g;
                if (j >= len) s[h][0] = s[h][1] = NEG_INF;
                if (j + 8 >= len) s[h][2] = s[h][3] = NEG_INF;
            }
        }
        // The online softmax per head: a column's maxima over its 8 lanes (the tile's first key
        // is below len, so they are finite).
        float x0 = NEG_INF, x1 = NEG_INF;
#pragma unroll
        for (int h = 0; h < DK / 16; h++) {
            x0 = fmaxf(x0, fmaxf(s[h][0], s[h][2]));
            x1 = fmaxf(x1, fmaxf(s[h][1], s[h][3]));
        }
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, sh));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, sh));
        }
        float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        float c0 = ex2(m0 - n0), c1 = ex2(m1 - n1);
        m0 = n0, m1 = n1;
        float e0 = 0.f, e1 = 0.f;
#pragma unroll
        for (int h = 0; h < DK / 16; h++) {
            s[h][0] = ex2(s[h][0] - n0), s[h][2] = ex2(s[h][2] - n0);
            s[h][1] = ex2(s[h][1] - n1), s[h][3] = ex2(s[h][3] - n1);
            e0 += s[h][0] + s[h][2];
            e1 += s[h][1] + s[h][3];
        }
        l0 = l0 * c0 + e0;
        l1 = l1 * c1 + e1;
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            o[d][0] *= c0, o[d][2] *= c0;
            o[d][1] *= c1, o[d][3] *= c1;
        }
        // O^T += V^T · P^T: P^T's B fragments are S^T's accumulators transposed (keys 2tq and
        // 2tq + 1, then 2tq + 8 and 2tq + 9, of head g); V^T's A fragments pair one element of
        // two keys (low halves: row g's element, high halves: row g + 8's).
#pragma unroll
        for (int h = 0; h < DK / 16; h++) {
            unsigned int pb0 = trans8(pack2(s[h][0], s[h][1])), pb1 = trans8(pack2(s[h][2], s[h][3]));
#pragma unroll
            for (int mt = 0; mt < HD / 16; mt++) {
                unsigned int a[4] = {__byte_perm(vw[h][0][mt], vw[h][1][mt], 0x5410u),
                                     __byte_perm(vw[h][0][mt], vw[h][1][mt], 0x7632u),
                                     __byte_perm(vw[h][2][mt], vw[h][3][mt], 0x5410u),
                                     __byte_perm(vw[h][2][mt], vw[h][3][mt], 0x7632u)};
                mma16816(o[mt], a, pb0, pb1);
            }
        }
    }

    // This warp's (max in natural-log units, sum, output) per head into shared memory.
    __device__ __forceinline__ void store(float (*so)[HD], float* sm, float* sl, int g, int tq) {
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
            l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int head = 2 * tq + c;
            if (head >= GQ) continue;
            if (g == 0) {
                sm[head] = (c ? m1 : m0) * LN2F;
                sl[head] = c ? l1 : l0;
            }
#pragma unroll
            for (int mt = 0; mt < HD / 16; mt++) {
                so[head][g * (HD / 8) + 2 * mt] = o[mt][c];
                so[head][g * (HD / 8) + 2 * mt + 1] = o[mt][2 + c];
            }
        }
    }
};
typedef KeyRows DecodeRows;

#else
// Heads as rows (rows g and g + 8 are heads g and g + 8; rows past GQ are 0), keys as columns.
struct HeadRows {
    unsigned int qa[HD / 16][4];
    // O: output column 2tq (+1) of n-tile dt is head element (2tq)·HD/8 + dt (+ HD/8).
    float o[HD / 8][4];
    float m0, m1, l0, l1;  // rows g, g + 8: running maxima (base 2) and this lane's sums

    __device__ __forceinline__ void init(const kt* q0, int g, int tq, float scale) {
        const kt* qg = q0 + g * HD + tq * (HD / 4);
        const kt* qg8 = qg + 8 * HD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (g < GQ) a[e] = kld(qg[4 * kk + e]) * scale;
                if (g + 8 < GQ) b[e] = kld(qg8[4 * kk + e]) * scale;
            }
            qa[kk][0] = pack2(a[0], a[1]);
            qa[kk][1] = pack2(b[0], b[1]);
            qa[kk][2] = pack2(a[2], a[3]);
            qa[kk][3] = pack2(b[2], b[3]);
        }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
        m0 = m1 = NEG_INF, l0 = l1 = 0.f;
    }

    __device__ __forceinline__ void tile(const unsigned int (*kw)[KWORDS], const unsigned int (*vw)[4][VWORDS],
                                         int key0, int len, int g, int tq) {
        float s[DK / 8][4];
#pragma unroll
        for (int nt = 0; nt < DK / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) mma16816(s[nt], qa[kk], kw[nt][2 * kk], kw[nt][2 * kk + 1]);
        }
        if (key0 + DK > len) {
#pragma unroll
            for (int nt = 0; nt < DK / 8; nt++) {
                int j = key0 + nt * 8 + 2 * tq;
                if (j >= len) s[nt][0] = s[nt][2] = NEG_INF;
                if (j + 1 >= len) s[nt][1] = s[nt][3] = NEG_INF;
            }
        }
        online_softmax<DK / 8>(s, o, m0, m1, l0, l1);
        // O += P · V: P's A fragments straight from the scores; V's B fragments pair the same
        // element of keys 2tq and 2tq+1 (b0) and of 2tq+8 and 2tq+9 (b1).
#pragma unroll
        for (int kk = 0; kk < DK / 16; kk++) {
            unsigned int pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                                  pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                unsigned int sel = (dt & 1) ? 0x7632u : 0x5410u;
                unsigned int b0 = __byte_perm(vw[kk][0][dt >> 1], vw[kk][1][dt >> 1], sel);
                unsigned int b1 = __byte_perm(vw[kk][2][dt >> 1], vw[kk][3][dt >> 1], sel);
                mma16816(o[dt], pa, b0, b1);
            }
        }
    }

    __device__ __forceinline__ void store(float (*so)[HD], float* sm, float* sl, int g, int tq) {
        for (int sh = 1; sh < 4; sh <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
            l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int row = g + 8 * half;
            if (row >= GQ) continue;
            if (tq == 0) {
                sm[row] = (half ? m1 : m0) * LN2F;
                sl[row] = half ? l1 : l0;
            }
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                so[row][(2 * tq) * (HD / 8) + dt] = o[dt][2 * half];
                so[row][(2 * tq + 1) * (HD / 8) + dt] = o[dt][2 * half + 1];
            }
        }
    }
};
typedef HeadRows DecodeRows;
#endif

// Whether `flash_decode_qkv` exists (`plan::decode_qkv_fits`): where `qkv_post` takes a head in
// QKV_TPH threads and a KV head's query heads and its K and V heads fit one block's.
#if defined(QKV_TPH) && (GQ + 2) * QKV_TPH <= 32 * DW
#define DECODE_QKV 1
#else
#define DECODE_QKV 0
#endif

// What `flash_decode_qkv` reads to do `qkv_post`'s work itself: `qkv_post`'s arguments.
struct QkvIn {
    const wt* qkv;
    const wt* bias;
    int has_bias;
    const wt* qn;
    const wt* kn;
    int has_norm;
    const float* cos_t;
    const float* sin_t;
    float eps;
};

// With FUSED (`flash_decode_qkv`, decode steps of one token a sequence), the block first does
// `qkv_post`'s work for its query: its GQ query heads into shared memory, where it reads Q from,
// and, in the one block of the query's KV head whose split walks the last tile, the token's K
// and V into the cache before any of its warps reads that tile. No other block of the step reads
// this token's key, and no kernel reads Q after, so `qkv_post` is one launch a layer fewer.
template <bool FUSED>
__device__ __forceinline__ void flash_decode_body(const kt* q, unsigned long long k_plane, unsigned long long v_plane,
                                                  const int* pos, const int* tab_off, const unsigned int* tables,
                                                  const int* toks, int use_toks, int bs, long long s_blk,
                                                  long long s_tok, long long s_head, wt* out, float* part,
                                                  unsigned int* counters, int H, int KVH, float scale_log2,
                                                  const int* deal, const QkvIn& in) {
    __shared__ float so[DW][GQ][HD];
    __shared__ float sm[DW][GQ], sl[DW][GQ];
    __shared__ __align__(16) kt sq[FUSED ? GQ : 1][HD];
    // The deal, positions and block tables are the host's, copied in before the step's first
    // kernel and written by none: their chain of loads, down to the first tile's row offsets, runs
    // before the wait, while the kernel before this one (which writes Q and this token's K and
    // V, or with FUSED the QKV product they come from) ends.
    const int dealt = deal[blockIdx.z * gridDim.x + blockIdx.x];
    if (dealt < 0) return;  // the same for the whole block: no barrier is left waiting
    const int slot = dealt >> 8, z = (dealt >> 4) & 15, splits = (dealt & 15) + 1;
    long long t = use_toks ? toks[slot] : slot;
    int kh = blockIdx.y, h0 = kh * GQ;
    int len = pos[t] + 1;
    int tiles = (len + DK - 1) / DK;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, tq = lane & 3;
    const unsigned int* tab = tables + tab_off[t];
    const int shift = block_shift(bs);
    const kt* K = (const kt*)k_plane + (long long)kh * s_head + tq * (HD / 4);
    const kt* V = (const kt*)v_plane + (long long)kh * s_head + g * (HD / 8);
    // Lane L's key of a tile: its row offset in the cache (keys past the end read the last
    // key's row, finite, and are masked).
    auto row_of = [&](int i) {
        int j = min(i * DK + lane, len - 1);
        int blk = key_block(j, bs, shift);
        return (long long)tab[blk] * s_blk + (long long)(j - blk * bs) * s_tok;
    };
    const int first = z * DW + warp;
    long long next_off = first < tiles ? row_of(first) : 0;
    // Two tiles' registers, a and b: a warp loads its next tile's K and V rows before it works
    // on this one's, so its loads stay in flight behind its arithmetic. Its first tile's rows
    // are loaded before the wait too, unless that tile holds the token's own key (the last
    // tile), which the kernel before this one writes: the others are earlier steps' keys.
    const int step = splits * DW;
    unsigned int ka[DK / 8][KWORDS], kb[DK / 8][KWORDS];
    unsigned int va[DK / 16][4][VWORDS], vb[DK / 16][4][VWORDS];
    const bool early = first < tiles - 1;
    if (early) load_tile(K, V, next_off, g, tq, ka, va);
#if DECODE_QKV
    if (FUSED) {
        // Thread j takes part j % QKV_TPH of head j / QKV_TPH of the block's: its GQ query
        // heads, then (in the block whose split walks the last tile) the KV head's K and V.
        // Its RoPE factors and the token's cache slot are the host's: looked up before the wait.
        const int hl = threadIdx.x / QKV_TPH, c = threadIdx.x % QKV_TPH * 8, p = len - 1;
        const bool owner = (tiles - 1) % step / DW == z;
        const bool live = hl < GQ || (owner && hl < GQ + 2);
        float rc[8], rs[8];
        long long at = 0;  // the token's K (and V) row of the KV head in the cache
        if (live) {
            rope_factors(in.cos_t, in.sin_t, p, c, rc, rs);
            int blk = key_block(p, bs, shift);
            at = (long long)tab[blk] * s_blk + (long long)(p - blk * bs) * s_tok + (long long)kh * s_head;
        }
        GRID_DEP_WAIT();
        if (live) {
            const int kind = hl < GQ ? 0 : hl - GQ + 1, hh = kind == 0 ? h0 + hl : H + (kind - 1) * KVH + kh;
            float o1[8], o2[8];
            qkv_head_part(in.qkv + t * (long long)((H + 2 * KVH) * HD), hh, kind, in.bias, in.has_bias,
                          kind == 0 ? in.qn : in.kn, in.has_norm, c, rc, rs, in.eps, o1, o2);
            kt* dst = kind == 0 ? sq[hl] : (kt*)(kind == 1 ? k_plane : v_plane) + at;
            kst8(dst + c, o1);
            kst8(dst + HD / 2 + c, o2);
        }
        // The query's heads, and the owner's K and V (global stores, which the barrier makes
        // visible to the block's loads of the last tile after it).
        __syncthreads();
    } else
#endif
    {
        GRID_DEP_WAIT();
    }

    DecodeRows rows;
    rows.init(FUSED ? &sq[0][0] : q + (t * H + h0) * HD, g, tq, scale_log2);
    if (first < tiles) {
        if (!early) load_tile(K, V, next_off, g, tq, ka, va);
        next_off = row_of(first + step);
    }
    // Row offsets past the last tile are the last key's again, never used.
    for (int i = first; i < tiles; i += 2 * step) {
        bool more = i + step < tiles;
        if (more) {
            load_tile(K, V, next_off, g, tq, kb, vb);
            next_off = row_of(i + 2 * step);
        }
        rows.tile(ka, va, i * DK, len, g, tq);
        if (!more) break;
        if (i + 2 * step < tiles) {
            load_tile(K, V, next_off, g, tq, ka, va);
            next_off = row_of(i + 3 * step);
        }
        rows.tile(kb, vb, (i + step) * DK, len, g, tq);
    }
    rows.store(so[warp], sm[warp], sl[warp], g, tq);
    __syncthreads();
    merge_warps<GQ, DW>(sm, sl, so, part, counters, out, t, slot, z, h0, H, splits);
}

extern "C" __global__ void __launch_bounds__(32 * DW)
flash_decode(const kt* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
             const int* tab_off, const unsigned int* tables, const int* toks, int use_toks, int vec, int bs,
             long long s_blk, long long s_tok, long long s_head, wt* out, float* part, unsigned int* counters,
             int H, int KVH, float scale_log2, const int* deal) {
    flash_decode_body<false>(q, k_plane, v_plane, pos, tab_off, tables, toks, use_toks, bs, s_blk, s_tok, s_head,
                             out, part, counters, H, KVH, scale_log2, deal, QkvIn{});
}

// `flash_decode` doing `qkv_post`'s work as well, for steps whose queries are each their
// sequence's only token (`forward::Forward::fuses_qkv`): `flash_decode`'s arguments (`q` unread)
// then `qkv_post`'s.
#if DECODE_QKV
extern "C" __global__ void __launch_bounds__(32 * DW)
flash_decode_qkv(const kt* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
                 const int* tab_off, const unsigned int* tables, const int* toks, int use_toks, int vec, int bs,
                 long long s_blk, long long s_tok, long long s_head, wt* out, float* part, unsigned int* counters,
                 int H, int KVH, float scale_log2, const int* deal, const wt* qkv, const wt* bias, int has_bias,
                 const wt* qn, const wt* kn, int has_norm, const float* cos_t, const float* sin_t, float eps) {
    flash_decode_body<true>(q, k_plane, v_plane, pos, tab_off, tables, toks, use_toks, bs, s_blk, s_tok, s_head,
                            out, part, counters, H, KVH, scale_log2, deal,
                            QkvIn{qkv, bias, has_bias, qn, kn, has_norm, cos_t, sin_t, eps});
}
#endif
#endif
