// Prefill attention on tensor cores: FlashAttention-2's scheme over the paged cache, for
// caches in f16 or bf16 and head dimensions HD (defined by the host) that are a multiple of 16
// and at most 128, on sm_80 and later. The host only loads `flash_prefill` when those hold.
//
// A block takes one tile of up to 128 consecutive query tokens of one sequence (a prompt chunk)
// and one head; each warp owns 16 · MT query rows (their Q fragments in registers, or read from
// shared memory where QS says). The block walks the sequence's keys BC at a time: tiles of K
// and V are copied from the cache through the block table into shared memory (dynamic, sized
// by the host from `flash_smem_bytes`) with `cp.async`, NST tiles in flight so the next tiles'
// copies overlap this tile's math; each warp computes its scores with `mma.sync.m16n8k16` (f32
// accumulators, K's fragments by `ldmatrix`), masks the causal edge, advances its online
// softmax (base-2: Q is pre-scaled by log2(e) / sqrt(HD)), and accumulates P · V with the
// scores re-used as the A operand straight from the registers and V's fragments read
// transposed by `ldmatrix.trans`. Rows past the tile's end compute over the tile's keys and are
// not written; a warp skips the key tiles past its own rows' last key. Blocks run the longest
// tiles (the last of a chunk, which attend to the most keys) first.
//
// Scores and output accumulate in f32; Q and the probabilities enter the tensor cores in the
// cache's type, as in FlashAttention itself. Grid (tiles, H), block FT.
//
// What bounds it is the instructions a warp issues per tile besides the mma.sync ones, and the
// shared-memory reads feeding them: so a K/V tile serves 128 rows, the cache's block of a key
// is found by shifts where the block size is a power of two (every layout xinf has; a division
// otherwise), a thread copies the same column of every few key rows (its shared-memory place
// fixed, a row's cache offset one 32-bit multiply-add from its block id), shared-memory
// addresses are a per-lane base plus constants, probabilities are packed two per conversion,
// 2^x is one ex2.approx.ftz, and one barrier per tile both publishes a tile and frees the
// buffer the next copy refills.

#if KT != 0 && HD % 16 == 0 && HD <= 128 && __CUDA_ARCH__ >= 800

// The block's shape, by head dimension. Up to 64: 8 warps of one m16 tile of rows each, K/V
// tiles of 64 keys. Above: 4 warps of two m16 tiles each (a K or V fragment read from shared
// memory feeds both, halving those reads per mma), K/V tiles of 32 keys, Q's fragments read
// from shared memory (in registers with the second tile's accumulators they would not fit),
// two blocks an SM. Either way a block takes 128 query rows (FLASH_TILE on the host). Each can
// be set from outside, for `doc/bench/gpu/flash_bench.py`'s versions.
#ifndef FW
#define FW (HD > 64 ? 4 : 8)     // warps per block
#endif
#ifndef MT
#define MT (HD > 64 ? 2 : 1)     // m16 row tiles per warp
#endif
#ifndef BC
#define BC (HD > 64 ? 32 : 64)   // keys per K/V tile
#endif
#ifndef QS
#define QS (HD > 64 ? 1 : 0)     // Q fragments from shared memory (1) or registers (0)
#endif
#ifndef NST
#define NST 2                    // K/V tiles in flight (shared-memory buffers of each)
#endif
#ifndef MINB
#define MINB (HD <= 64 ? 16 / FW : 8 / FW)  // blocks per SM the registers are sized for
#endif
#if NST < 2
#error "flash_prefill keeps at least two K/V tiles in flight (one barrier per tile needs it)"
#endif
#define FT (32 * FW)             // threads per block
#define KPAD (HD + 8)            // row pitch of the K and V tiles: rows 16 bytes apart in the banks
#define TILE_BYTES (BC * KPAD * 2)  // one K (or V) tile in shared memory
#define CHUNKS (BC * (HD / 8))   // 16-byte pieces of one K (or V) tile
#define PER_T ((CHUNKS + FT - 1) / FT)  // of them per thread

// What the host reads from the module to launch `flash_prefill`: its threads, its query rows,
// and its dynamic shared memory (NST buffers of a K and a V tile, and Q's tile where QS), which
// the host allows past the 48 KB default.
extern "C" __device__ const int flash_threads = FT;
extern "C" __device__ const int flash_rows = 16 * FW * MT;
extern "C" __device__ const int flash_smem_bytes = NST * 2 * TILE_BYTES + QS * 16 * FW * MT * KPAD * 2;

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

// Two values in the cache's type, `lo` in the low half (the lower column of a fragment), in one
// conversion (round to nearest even, as `kst`).
__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    unsigned int r;
#if KT == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// 2^x in one special-function instruction; results below f32's normal range (2^-126) become 0
// (exp2f also scales subnormals, several instructions more per score). Every row's largest
// term is 2^0 = 1, so what is dropped is under 2^-126 of it: nothing a 16-bit output shows.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global → shared (address `dst`) without passing through registers; zeros when
// `!valid`.
__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// The log2 of a cache block size that is a power of two (every layout xinf has), else -1; the
// same for a whole launch, so `key_block`'s branch is uniform.
__device__ __forceinline__ int block_shift(int bs) { return (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1; }

// Which of its sequence's cache blocks holds key j: a shift where `shift` (block_shift) allows,
// a division otherwise.
__device__ __forceinline__ int key_block(int j, int bs, int shift) {
    return shift >= 0 ? j >> shift : j / bs;
}

// One tile's step of the online softmax (base 2) for a warp's rows g and g + 8 (the m16 tile's
// row halves): the tile's NT × 8 scores `s` (accumulator layout) become probabilities against the
// new running maxima, which the 4 lanes of a row share; the running sums (this lane's part; the
// caller sums them over the row's lanes at the end) and the outputs `o` are rescaled.
template <int NT>
__device__ __forceinline__ void online_softmax(float (*s)[4], float (*o)[4], float& m0, float& m1, float& l0,
                                               float& l1) {
    float x0 = NEG_INF, x1 = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        x0 = fmaxf(x0, fmaxf(s[nt][0], s[nt][1]));
        x1 = fmaxf(x1, fmaxf(s[nt][2], s[nt][3]));
    }
    for (int sh = 1; sh < 4; sh <<= 1) {
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, sh));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, sh));
    }
    float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
    float c0 = ex2(m0 - n0), c1 = ex2(m1 - n1);
    float e0 = 0.f, e1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = ex2(s[nt][0] - n0);
        s[nt][1] = ex2(s[nt][1] - n0);
        s[nt][2] = ex2(s[nt][2] - n1);
        s[nt][3] = ex2(s[nt][3] - n1);
        e0 += s[nt][0] + s[nt][1];
        e1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + e0;
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
}

// One k-step's A fragments of a warp's m16 tile from shared memory (`at`: this lane's row and
// column half of the step, as `q_lane` computes).
__device__ __forceinline__ void q_frag(unsigned int* a, unsigned int at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(at));
}

extern "C" __global__ void __launch_bounds__(FT, MINB)
flash_prefill(const float* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
              const int* tab_off, const unsigned int* tables, const int* tiles, int bs, long long s_blk,
              long long s_tok, long long s_head, wt* out, int H, int KVH, float scale_log2) {
    GRID_DEP_WAIT();
    extern __shared__ __align__(16) unsigned char flash_smem[];
    int tile = gridDim.x - 1 - blockIdx.x;  // the longest tiles first
    int t0 = tiles[2 * tile], n = tiles[2 * tile + 1];
    int h = blockIdx.y, kh = h / (H / KVH);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, tq = lane & 3;  // the fragment's row group and column pair
    const kt* K = (const kt*)k_plane;
    const kt* V = (const kt*)v_plane;
    const unsigned int* tab = tables + tab_off[t0];
    int p0 = pos[t0];
    int last = p0 + n - 1;  // the last key any row of the tile attends to
    int nkb = last / BC + 1;
    // This warp's rows: MT m16 tiles from row warp · 16 · MT; fragment rows g and g + 8 of each.
    int wr0 = warp * 16 * MT;
    int lim[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        lim[mt][0] = p0 + min(wr0 + mt * 16 + g, n - 1);
        lim[mt][1] = p0 + min(wr0 + mt * 16 + g + 8, n - 1);
    }
    bool busy = wr0 < n;  // whether this warp has a row to write
    const int wlim = p0 + min(wr0 + 16 * MT - 1, n - 1);  // the warp's last key

    const unsigned int ks = smem_addr(flash_smem), vs = ks + NST * TILE_BYTES;
    const int shift = block_shift(bs);

#if FT % (HD / 8) == 0
    // A thread copies the same 16 bytes of every KSTEP-th key row of a tile: its column and
    // its first row's place in shared memory are fixed, and a chunk's offset in the cache is
    // one 32 × 32 → 64-bit multiply-add from the block id (the strides fit 32 bits: the host
    // checks).
#define KSTEP (FT / (HD / 8))
    const int key0 = threadIdx.x / (HD / 8), col = (threadIdx.x % (HD / 8)) * 8;
    const unsigned int at0 = (key0 * KPAD + col) * 2;
    const kt* Kc = K + (long long)kh * s_head + col;
    const kt* Vc = V + (long long)kh * s_head + col;
    const unsigned int sblk = (unsigned int)s_blk, stok = (unsigned int)s_tok;
    unsigned long long off[PER_T];
    auto fetch_blocks = [&](int kb) {
#pragma unroll
        for (int i = 0; i < PER_T; i++) {
            int j = kb * BC + key0 + i * KSTEP;
            int blk = key_block(j, bs, shift);
            unsigned int b = (CHUNKS % FT == 0 || key0 + i * KSTEP < BC) && j <= last ? tab[blk] : 0u;
            off[i] = (unsigned long long)b * sblk + (unsigned int)(j - blk * bs) * stok;
        }
    };
    auto load = [&](int kb, int buf) {
#pragma unroll
        for (int i = 0; i < PER_T; i++) {
            if (CHUNKS % FT != 0 && key0 + i * KSTEP >= BC) break;
            bool valid = kb * BC + key0 + i * KSTEP <= last;
            unsigned int at = buf * TILE_BYTES + at0 + i * KSTEP * KPAD * 2;
            cp_async16(ks + at, Kc + off[i], valid);
            cp_async16(vs + at, Vc + off[i], valid);
        }
        asm volatile("cp.async.commit_group;");
    };
#else
    // Otherwise (heads of 48 on 8 warps) each chunk's key and column are worked out anew.
    unsigned int nb[PER_T];
    int slot[PER_T];
    auto fetch_blocks = [&](int kb) {
#pragma unroll
        for (int i = 0; i < PER_T; i++) {
            int idx = threadIdx.x + FT * i, j = kb * BC + idx / (HD / 8);
            int blk = key_block(j, bs, shift);
            slot[i] = j - blk * bs;
            nb[i] = idx < CHUNKS && j <= last ? tab[blk] : 0u;
        }
    };
    auto load = [&](int kb, int buf) {
#pragma unroll
        for (int i = 0; i < PER_T; i++) {
            int idx = threadIdx.x + FT * i;
            if (CHUNKS % FT != 0 && idx >= CHUNKS) break;
            int key = idx / (HD / 8), c8 = (idx % (HD / 8)) * 8;
            bool valid = kb * BC + key <= last;
            long long base = valid ? (long long)nb[i] * s_blk + (long long)slot[i] * s_tok + kh * s_head + c8
                                   : 0;
            unsigned int at = buf * TILE_BYTES + (key * KPAD + c8) * 2;
            cp_async16(ks + at, K + base, valid);
            cp_async16(vs + at, V + base, valid);
        }
        asm volatile("cp.async.commit_group;");
    };
#endif
    const int mi = lane >> 3, mr = lane & 7;
    const unsigned int k_lane = ks + (mr * KPAD + (mi >> 1) * 16 + (mi & 1) * 8) * 2;
    const unsigned int k_lane2 = ks + (mr * KPAD + (mi & 1) * 8) * 2;
    const unsigned int v_lane = vs + (((mi & 1) * 8 + mr) * KPAD + (mi >> 1) * 8) * 2;

#if QS
    // Q in shared memory, after the K/V buffers: the tile's rows (rows past its end repeat its
    // last), pre-scaled, in the cache's type; A fragments by ldmatrix.x4 (matrix i: rows
    // (i & 1) · 8, columns (i >> 1) · 8 of a 16 × 16 step).
    const unsigned int qs = ks + 2 * NST * TILE_BYTES;
    {
        u16* qsm = (u16*)(flash_smem + 2 * NST * TILE_BYTES);
        for (int idx = threadIdx.x; idx < 16 * FW * MT * (HD / 8); idx += FT) {
            int r = idx / (HD / 8), c8 = (idx % (HD / 8)) * 8;
            const float4* src = (const float4*)(q + ((long long)(t0 + min(r, n - 1)) * H + h) * HD + c8);
            float4 a = src[0], b = src[1];
            uint4 w;
            w.x = pack2(a.x * scale_log2, a.y * scale_log2);
            w.y = pack2(a.z * scale_log2, a.w * scale_log2);
            w.z = pack2(b.x * scale_log2, b.y * scale_log2);
            w.w = pack2(b.z * scale_log2, b.w * scale_log2);
            *(uint4*)(qsm + r * KPAD + c8) = w;
        }
    }
    const unsigned int q_lane = qs + ((wr0 + (mi & 1) * 8 + mr) * KPAD + (mi >> 1) * 8) * 2;
#else
    unsigned int qa[MT][HD / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const float* q0 = q + ((long long)(t0 + min(wr0 + mt * 16 + g, n - 1)) * H + h) * HD;
        const float* q1 = q + ((long long)(t0 + min(wr0 + mt * 16 + g + 8, n - 1)) * H + h) * HD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            int c = kk * 16 + 2 * tq;
            qa[mt][kk][0] = pack2(q0[c] * scale_log2, q0[c + 1] * scale_log2);
            qa[mt][kk][1] = pack2(q1[c] * scale_log2, q1[c + 1] * scale_log2);
            qa[mt][kk][2] = pack2(q0[c + 8] * scale_log2, q0[c + 9] * scale_log2);
            qa[mt][kk][3] = pack2(q1[c + 8] * scale_log2, q1[c + 9] * scale_log2);
        }
    }
#endif
    float o[MT][HD / 8][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int d = 0; d < HD / 8; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }

#pragma unroll
    for (int st = 0; st < NST - 1; st++) {
        fetch_blocks(st);
        if (st < nkb) {
            load(st, st);
        } else {
            asm volatile("cp.async.commit_group;");
        }
    }
    fetch_blocks(NST - 1);
    for (int kb = 0; kb < nkb; kb++) {
        int buf = kb % NST;
        int ahead = kb + NST - 1;
        // Tile kb's copy is the oldest in flight; once it has landed, one barrier says both that
        // every warp sees it and that every warp is done with tile kb - 1, whose buffer the copy
        // of tile kb + NST - 1 then refills.
        asm volatile("cp.async.wait_group %0;" ::"n"(NST - 2));
        __syncthreads();
        if (ahead < nkb) {
            load(ahead, ahead % NST);
            fetch_blocks(ahead + 1);
        } else {
            asm volatile("cp.async.commit_group;");
        }
        if (busy && kb * BC <= wlim) {
            const unsigned int kt_at = buf * TILE_BYTES;
            float s[MT][BC / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
            // Two k-steps at a time (a K `ldmatrix.x4` holds both), then an odd last one alone
            // by `ldmatrix.x2` (lanes 0-15's addresses are read).
#pragma unroll
            for (int kk = 0; kk + 1 < HD / 16; kk += 2) {
#if QS
                unsigned int qa[MT][2][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int k2 = 0; k2 < 2; k2++) q_frag(qa[mt][k2], q_lane + (mt * 16 * KPAD + (kk + k2) * 16) * 2);
#define QA(mt, k) qa[mt][k]
#else
#define QA(mt, k) qa[mt][kk + k]
#endif
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) {
                    unsigned int b[4];
                    unsigned int kr = k_lane + kt_at + (nt * 8 * KPAD + kk * 16) * 2;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                                 : "r"(kr));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(s[mt][nt], QA(mt, 0), b[0], b[1]);
                        mma16816(s[mt][nt], QA(mt, 1), b[2], b[3]);
                    }
                }
#undef QA
            }
            if ((HD / 16) % 2) {
                const int kk = HD / 16 - 1;
#if QS
                unsigned int qa[MT][1][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) q_frag(qa[mt][0], q_lane + (mt * 16 * KPAD + kk * 16) * 2);
#define QA(mt) qa[mt][0]
#else
#define QA(mt) qa[mt][kk]
#endif
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) {
                    unsigned int b0, b1;
                    unsigned int kr = k_lane2 + kt_at + (nt * 8 * KPAD + kk * 16) * 2;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                                 : "=r"(b0), "=r"(b1)
                                 : "r"(kr));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) mma16816(s[mt][nt], QA(mt), b0, b1);
                }
#undef QA
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (kb * BC + BC - 1 > lim[mt][0] || kb * BC + BC - 1 > lim[mt][1]) {
#pragma unroll
                    for (int nt = 0; nt < BC / 8; nt++) {
                        int j = kb * BC + nt * 8 + 2 * tq;
                        if (j > lim[mt][0]) s[mt][nt][0] = NEG_INF;
                        if (j + 1 > lim[mt][0]) s[mt][nt][1] = NEG_INF;
                        if (j > lim[mt][1]) s[mt][nt][2] = NEG_INF;
                        if (j + 1 > lim[mt][1]) s[mt][nt][3] = NEG_INF;
                    }
                }
                online_softmax<BC / 8>(s[mt], o[mt], m[mt][0], m[mt][1], l[mt][0], l[mt][1]);
            }
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                unsigned int pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) {
                    unsigned int b[4];
                    unsigned int vr = v_lane + kt_at + (kk * 16 * KPAD + dp * 16) * 2;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                                 : "r"(vr));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(o[mt][2 * dp], pa[mt], b[0], b[1]);
                        mma16816(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                    }
                }
            }
        }
    }
    if (!busy) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = l[mt][0], l1 = l[mt][1];
        for (int sh = 1; sh < 4; sh <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
            l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
        }
        float i0 = 1.f / l0, i1 = 1.f / l1;
        int r0 = wr0 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            int c = d * 8 + 2 * tq;
            if (r0 < n) {
                wt* w = out + ((long long)(t0 + r0) * H + h) * HD + c;
                w[0] = wst(o[mt][d][0] * i0);
                w[1] = wst(o[mt][d][1] * i0);
            }
            if (r1 < n) {
                wt* w = out + ((long long)(t0 + r1) * H + h) * HD + c;
                w[0] = wst(o[mt][d][2] * i1);
                w[1] = wst(o[mt][d][3] * i1);
            }
        }
    }
}


// Decode attention on tensor cores: one query token against its sequence's keys, the GQ query
// heads sharing a KV head (GQA) taken as the rows of one m16n8k16 tile, so every K and V row
// is read once for all of them and scores and outputs come from mma.sync instead of a
// shuffle per head per key. Grid (queries, KVH, splits) — token blockIdx.x, or the one listed in
// `toks` with `use_toks` — block 32 · DW. The keys go in tiles of 32 dealt round robin to the
// splits' warps; a warp loads its tile's K and V straight from the cache into registers (no
// shared memory, no block-wide barrier in the loop), so each warp keeps 16 loads of 16 bytes in
// flight per tile and the warps of an SM overlap them.
//
// Operands are read in a permuted but consistent order, so every load is a whole row segment:
// - scores: lane (g, tq) loads key g's elements [tq·HD/4, (tq+1)·HD/4) and step kk uses its words
//   2kk and 2kk+1 as b0 and b1; Q's A fragments take the same elements, so the dot products are
//   the same sums over a permuted head dimension;
// - P·V: lane (g, tq) loads elements [g·HD/8, (g+1)·HD/8) of keys 2tq, 2tq+1, 2tq+8 and 2tq+9 of
//   each 16, and pairs halves across rows with byte permutes into B fragments; output column g of
//   n-tile dt is therefore head element g·HD/8 + dt.
// Each warp's (max, sum, output) meet in shared memory; with several splits the last block of a
// query merges all partials (merge_splits, natural-log maxima). A query takes only the splits
// its keys fill, one tile per warp, up to the grid's: the grid is sized from the step's shape
// (a graph replays it whatever the lengths), but a short sequence in a grid of 16 splits would
// otherwise leave most blocks empty and still pay a merge across all 16; with one split there
// is none. The blocks past a query's splits return at once. Its arguments are `attention`'s
// (`vec` unused: the host runs it on caches whose rows are whole aligned words), but for the
// scale, log2(e) / sqrt(HD) as in flash_prefill.
#if GQ <= 16
#define DW 4                // warps per flash_decode block
#define DK (HD > 64 ? 16 : 32)  // keys per warp tile: its K and V segments stay in registers
#define KWORDS (HD / 8)     // words of a lane's K row segment (HD/4 elements)
#define VWORDS (HD / 16)    // words of a lane's V row segment (HD/8 elements)

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

extern "C" __global__ void __launch_bounds__(32 * DW)
flash_decode(const float* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
             const int* tab_off, const unsigned int* tables, const int* toks, int use_toks, int vec, int bs,
             long long s_blk, long long s_tok, long long s_head, wt* out, float* part, unsigned int* counters,
             int H, int KVH, float scale_log2) {
    __shared__ float so[DW][GQ][HD];
    __shared__ float sm[DW][GQ], sl[DW][GQ];
    // The positions and block tables are the host's, copied in before the step's first kernel
    // and written by none: their chain of loads, down to the first tile's row offsets, runs
    // before the wait, while the kernel before this one (which writes Q and this token's K and
    // V) ends.
    long long t = use_toks ? toks[blockIdx.x] : blockIdx.x;
    int kh = blockIdx.y, h0 = kh * GQ;
    int len = pos[t] + 1;
    int tiles = (len + DK - 1) / DK;
    int z = blockIdx.z, splits = min((int)gridDim.z, (tiles + DW - 1) / DW);
    if (z >= splits) return;  // the same for the whole block: no barrier is left waiting
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
    GRID_DEP_WAIT();

    // Q's A fragments (rows g and g + 8 are heads h0 + g and h0 + g + 8; rows past GQ are 0),
    // in the permuted element order of the K segments.
    unsigned int qa[HD / 16][4];
    {
        const float* q0 = q + ((t * H) + h0 + g) * HD + tq * (HD / 4);
        const float* q1 = q0 + 8 * HD;
        bool v0 = g < GQ, v1 = g + 8 < GQ;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (v0) a[e] = q0[4 * kk + e] * scale_log2;
                if (v1) b[e] = q1[4 * kk + e] * scale_log2;
            }
            qa[kk][0] = pack2(a[0], a[1]);
            qa[kk][1] = pack2(b[0], b[1]);
            qa[kk][2] = pack2(a[2], a[3]);
            qa[kk][3] = pack2(b[2], b[3]);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;

    for (int i = first; i < tiles; i += splits * DW) {
        // Lane L holds key i·DK + L's row offset; the others get it by shuffle.
        long long off = i == first ? next_off : row_of(i);
        unsigned int kw[DK / 8][KWORDS];
#pragma unroll
        for (int nt = 0; nt < DK / 8; nt++) load_words<KWORDS>(K + shfl64(off, nt * 8 + g), kw[nt]);
        unsigned int vw[DK / 16][4][VWORDS];
#pragma unroll
        for (int kk = 0; kk < DK / 16; kk++) {
#pragma unroll
            for (int r = 0; r < 4; r++)
                load_words<VWORDS>(V + shfl64(off, kk * 16 + 2 * tq + (r & 1) + (r >> 1) * 8), vw[kk][r]);
        }
        float s[DK / 8][4];
#pragma unroll
        for (int nt = 0; nt < DK / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) mma16816(s[nt], qa[kk], kw[nt][2 * kk], kw[nt][2 * kk + 1]);
        }
        if ((i + 1) * DK > len) {
#pragma unroll
            for (int nt = 0; nt < DK / 8; nt++) {
                int jj = i * DK + nt * 8 + 2 * tq;
                if (jj >= len) s[nt][0] = s[nt][2] = NEG_INF;
                if (jj + 1 >= len) s[nt][1] = s[nt][3] = NEG_INF;
            }
        }
        // The tile's first key is below len, so the maxima are finite.
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
    // This warp's rows into shared memory: sums over the 4 lanes of a row, maxima in natural-log
    // units (merge_splits' and the merge below's), output column 2tq (+1) of n-tile dt at
    // element (2tq)·HD/8 + dt (+ HD/8).
    for (int sh = 1; sh < 4; sh <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
        l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
    }
    const float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int row = g + 8 * half;
        if (row >= GQ) continue;
        if (tq == 0) {
            sm[warp][row] = (half ? m1 : m0) * LN2;
            sl[warp][row] = half ? l1 : l0;
        }
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            so[warp][row][(2 * tq) * (HD / 8) + dt] = o[dt][2 * half];
            so[warp][row][(2 * tq + 1) * (HD / 8) + dt] = o[dt][2 * half + 1];
        }
    }
    __syncthreads();
    merge_warps<GQ, DW>(sm, sl, so, part, counters, out, t, h0, H, splits);
}
#endif

#endif
