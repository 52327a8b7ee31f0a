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
// tiles (those that attend to the most keys) first, over every head and every chunk of the step:
// the host lists tiles from the fewest keys to the most and the heads are the grid's first
// dimension, which the GPU hands out first, so the step's last blocks are its shortest (a
// causal prompt's tiles differ in work up to its length in tiles) and a KV head's query heads
// read its K/V tiles at about the same time.
//
// Scores and output accumulate in f32; Q and the probabilities enter the tensor cores in the
// cache's type, as in FlashAttention itself. Grid (H, tiles), block FT.
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

// On Hopper, heads of 64 and 128 take `flash_sm90.cu`'s kernel (wgmma) instead of this file's;
// the helpers below serve both (and `decode.cu`). `FLASH_MMA_SYNC` keeps this one.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && (HD == 64 || HD == 128) && !defined(FLASH_MMA_SYNC)
#define FLASH_SM90 1
#else
#define FLASH_SM90 0
#endif

#if !FLASH_SM90

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

#endif  // !FLASH_SM90

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

#if !FLASH_SM90
// One k-step's A fragments of a warp's m16 tile from shared memory (`at`: this lane's row and
// column half of the step, as `q_lane` computes).
__device__ __forceinline__ void q_frag(unsigned int* a, unsigned int at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(at));
}

extern "C" __global__ void __launch_bounds__(FT, MINB)
flash_prefill(const kt* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
              const int* tab_off, const unsigned int* tables, const int* tiles, int bs, long long s_blk,
              long long s_tok, long long s_head, wt* out, int H, int KVH, float scale_log2) {
    GRID_DEP_WAIT();
    extern __shared__ __align__(16) unsigned char flash_smem[];
    int tile = gridDim.y - 1 - blockIdx.y;  // the longest tiles first
    int t0 = tiles[2 * tile], n = tiles[2 * tile + 1];
    int h = blockIdx.x, kh = h / (H / KVH);
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
            float a[8];
            kld8(q + ((long long)(t0 + min(r, n - 1)) * H + h) * HD + c8, a);
            uint4 w;
            w.x = pack2(a[0] * scale_log2, a[1] * scale_log2);
            w.y = pack2(a[2] * scale_log2, a[3] * scale_log2);
            w.z = pack2(a[4] * scale_log2, a[5] * scale_log2);
            w.w = pack2(a[6] * scale_log2, a[7] * scale_log2);
            *(uint4*)(qsm + r * KPAD + c8) = w;
        }
    }
    const unsigned int q_lane = qs + ((wr0 + (mi & 1) * 8 + mr) * KPAD + (mi >> 1) * 8) * 2;
#else
    unsigned int qa[MT][HD / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const kt* q0 = q + ((long long)(t0 + min(wr0 + mt * 16 + g, n - 1)) * H + h) * HD;
        const kt* q1 = q + ((long long)(t0 + min(wr0 + mt * 16 + g + 8, n - 1)) * H + h) * HD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            int c = kk * 16 + 2 * tq;
            qa[mt][kk][0] = pack2(kld(q0[c]) * scale_log2, kld(q0[c + 1]) * scale_log2);
            qa[mt][kk][1] = pack2(kld(q1[c]) * scale_log2, kld(q1[c + 1]) * scale_log2);
            qa[mt][kk][2] = pack2(kld(q0[c + 8]) * scale_log2, kld(q0[c + 9]) * scale_log2);
            qa[mt][kk][3] = pack2(kld(q1[c + 8]) * scale_log2, kld(q1[c + 9]) * scale_log2);
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

#endif  // !FLASH_SM90

#endif
