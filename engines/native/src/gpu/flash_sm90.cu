// Prefill attention on Hopper (sm_90a): FlashAttention 3's scheme over the paged cache, for
// caches in f16 or bf16 and heads of 64 or 128. It takes the place of `flash.cu`'s kernel there
// (`FLASH_SM90`): the same arguments, grid (H, tiles: the longest first) and 128-row tiles, its
// block shape in the same module constants, and `flash.cu`'s helpers.
//
// A block is three warpgroups. The first copies K and V tiles of 128 keys from the cache through
// the block table into shared memory with `cp.async` (a paged cache's rows are not one box a
// TMA copy could take), two tiles of each in flight; each copy's completion arrives on the
// tile's "full" mbarrier (`cp.async.mbarrier.arrive.noinc`), and the copier waits on the tile's
// "empty" mbarrier before it refills a buffer. The other two warpgroups each own 64 query rows:
// S = Q · Kᵀ is `wgmma` m64n128k16 with Q and K in shared memory, O += P · V is `wgmma`
// m64n{HD}k16 with P straight from the score registers and V read transposed. A warpgroup issues
// the next tile's Q · Kᵀ, then this tile's P · V, and works out the next tile's softmax while
// P · V runs (FlashAttention 3's intra-warpgroup overlap), so the exponentials and the tensor
// cores overlap. `setmaxnreg` gives the copier 88 registers a thread and the others 208 (all 65,536).
//
// Shared memory holds every tile in the 128-byte swizzled layout `wgmma` reads without bank
// conflicts: a row's 16-byte chunk c of each 64-column half lands at chunk c ^ (row % 8), in
// 1024-byte groups of 8 rows; each half of a tile is a block of its own.
//
// Scores and output accumulate in f32; Q (pre-scaled by log2(e) / sqrt(HD)) and the
// probabilities enter the tensor cores in the cache's type, as in `flash.cu`'s kernel.
//
// Two switches for `doc/bench/gpu/flash_bench.py`'s versions: `PINGPONG 0` lets both warpgroups
// issue whenever they are ready; `PERSIST 1` keeps a block an SM resident, walking every
// gridDim.x-th (head, tile) item, longest first, its copier running into the next item while the
// warpgroups finish the last (the host reads `flash_persistent` and launches it so). On an H100
// the resident blocks took 0.97× the time of several prompts in one launch on the 8B shape and
// 0.91× on sixteen 733-token prompts of the 0.5B shape, but 1.13× on one 2,833-token prompt of
// it (322 items dealt in turn to 132 blocks), and served the same output tokens/s; so blocks
// are launched one an item and the hardware deals them.

#if FLASH_SM90

#define BC 128                        // keys per K/V tile
#define NST 2                         // K/V tiles in flight
#define FT 384                        // threads: the copier's warpgroup, then two of 64 rows
#define KV_TILE (BC * HD * 2)         // bytes of a K (or V) tile
#define Q_WG (64 * HD * 2)            // bytes of a warpgroup's Q rows
#define SM_K (2 * Q_WG)               // offsets in the block's (1024-aligned) shared memory
#define SM_V (SM_K + NST * KV_TILE)
#define SM_BAR (SM_V + NST * KV_TILE)
#define COPY_REGS 88
#define MMA_REGS 208
#ifndef PINGPONG
#define PINGPONG 1                    // the two warpgroups take turns at the tensor cores
#endif
#ifndef PERSIST
#define PERSIST 0                     // blocks stay resident and walk the work items
#endif
#if PERSIST
#define PERSIST_ARG , int ntiles      // the host launches a block an SM and passes the tiles' count
#else
#define PERSIST_ARG
#endif
#define CSTEP (128 / (HD / 8))        // key rows between a copier thread's pieces (8 or 16)
#define CPER (BC / CSTEP)             // pieces of a K (or V) tile a copier thread copies

extern "C" __device__ const int flash_threads = FT;
extern "C" __device__ const int flash_rows = 128;
extern "C" __device__ const int flash_persistent = PERSIST;
// Room for 16 mbarriers after the tiles (4 · NST are used), and 1 KB to align the start.
extern "C" __device__ const int flash_smem_bytes = SM_BAR + 16 * 8 + 1024;

#if KT == 1
#define WG_T "f16"
#else
#define WG_T "bf16"
#endif

// mbarriers: `count` arrivals complete a phase; a wait is for the phase of the given parity.
__device__ __forceinline__ void mbar_init(unsigned int bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_wait(unsigned int bar, int parity) {
    unsigned int done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// A warp's arrival (the barriers of consumed tiles count one per warp of the two warpgroups).
__device__ __forceinline__ void mbar_release(unsigned int bar, int lane) {
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrives on `bar` once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive(unsigned int bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// What the copier wrote (generic proxy) becomes visible to this thread's wgmma (async proxy).
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Registers a wgmma in flight writes (or reads) are touched only past its wait: this pins
// each to the program point, so the compiler neither reads them earlier nor reuses them.
template <int N>
__device__ __forceinline__ void pin(float* r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void pin(unsigned int* r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// A shared-memory matrix descriptor for the 128-byte swizzled layout: start, leading and
// stride byte offsets (in 16-byte units, as the descriptor keeps them).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned int addr, unsigned int lead, unsigned int stride) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) | ((unsigned long long)(lead >> 4) << 16) |
           ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}

// The accumulator operands of an m64nNk16 wgmma (N / 2 f32 registers a thread) and their
// places in its register list.
#define WG_D8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D64 WG_D32, WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
#define WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R64 WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// d = A · B (+ d where `acc`), m64n128k16; A and B in shared memory (descriptors), K-major.
__device__ __forceinline__ void wgmma_ss_n128(float* d, unsigned long long a, unsigned long long b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T
                 "." WG_T " {" WG_R64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_D64
                 : "l"(a), "l"(b), "r"(acc));
}

// d = A · B (+ d where `acc`), m64n{128, 64}k16; A in registers (each warp's m16n8k16 A fragment
// of its 16 rows), B in shared memory MN-major (transposed: its rows are k).
__device__ __forceinline__ void wgmma_rs_n128(float* d, const unsigned int* a, unsigned long long b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T
                 "." WG_T " {" WG_R64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

__device__ __forceinline__ void wgmma_rs_n64(float* d, const unsigned int* a, unsigned long long b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." WG_T
                 "." WG_T " {" WG_R32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}

// S = Q · Kᵀ over the head dimension: HD / 16 k-steps, each 32 bytes further into a row's
// 128-byte half (the hardware swizzles the address as the copies did).
__device__ __forceinline__ void issue_qk(float* s, unsigned int qw, unsigned int kw) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        unsigned long long a = sw128_desc(qw + (kk >> 2) * (64 * 128) + (kk & 3) * 32, 16, 1024);
        unsigned long long b = sw128_desc(kw + (kk >> 2) * (BC * 128) + (kk & 3) * 32, 16, 1024);
        wgmma_ss_n128(s, a, b, kk > 0);
    }
    wgmma_commit();
}

// O += P · V over the tile's keys: BC / 16 k-steps of 16 key rows (2 KB); V is read
// transposed, its two 64-column halves BC · 128 bytes apart.
__device__ __forceinline__ void issue_pv(float* o, unsigned int (*p)[4], unsigned int vt) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
        unsigned long long b = sw128_desc(vt + kk * 16 * 128, BC * 128, 1024);
#if HD == 128
        wgmma_rs_n128(o, p[kk], b, 1);
#else
        wgmma_rs_n64(o, p[kk], b, 1);
#endif
    }
    wgmma_commit();
}

// Keys past a row's own position get no weight. Accumulator layout: block nt of 8 columns holds
// (row g: columns 2tq, 2tq + 1; row g + 8: the same).
__device__ __forceinline__ void mask_tile(float* s, int kb, int lim0, int lim1, int tq) {
    if (kb * BC + BC - 1 <= lim0) return;  // lim0 ≤ lim1
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        int j = kb * BC + nt * 8 + 2 * tq;
        if (j > lim0) s[4 * nt] = NEG_INF;
        if (j + 1 > lim0) s[4 * nt + 1] = NEG_INF;
        if (j > lim1) s[4 * nt + 2] = NEG_INF;
        if (j + 1 > lim1) s[4 * nt + 3] = NEG_INF;
    }
}

// One tile's step of the online softmax (base 2) for the thread's rows g and g + 8: the scores
// become probabilities against the new running maxima; c0 and c1 are what the outputs so far
// must be scaled by. The running sums are this lane's part; the epilogue sums a row's 4 lanes.
__device__ __forceinline__ void softmax_tile(float* s, float& m0, float& m1, float& l0, float& l1, float& c0,
                                             float& c1) {
    float x0 = NEG_INF, x1 = NEG_INF;
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        x0 = fmaxf(x0, fmaxf(s[4 * nt], s[4 * nt + 1]));
        x1 = fmaxf(x1, fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
    }
#pragma unroll
    for (int sh = 1; sh < 4; sh <<= 1) {
        x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, sh));
        x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, sh));
    }
    float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
    c0 = ex2(m0 - n0);
    c1 = ex2(m1 - n1);
    float e0 = 0.f, e1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
        s[4 * nt] = ex2(s[4 * nt] - n0);
        s[4 * nt + 1] = ex2(s[4 * nt + 1] - n0);
        s[4 * nt + 2] = ex2(s[4 * nt + 2] - n1);
        s[4 * nt + 3] = ex2(s[4 * nt + 3] - n1);
        e0 += s[4 * nt] + s[4 * nt + 1];
        e1 += s[4 * nt + 2] + s[4 * nt + 3];
    }
    l0 = l0 * c0 + e0;
    l1 = l1 * c1 + e1;
    m0 = n0;
    m1 = n1;
}

// The outputs so far, scaled by softmax_tile's factors.
__device__ __forceinline__ void rescale(float* o, float c0, float c1) {
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        o[4 * d] *= c0;
        o[4 * d + 1] *= c0;
        o[4 * d + 2] *= c1;
        o[4 * d + 3] *= c1;
    }
}

// The probabilities as P · V's A fragments: k-step kk takes column blocks 2kk and 2kk + 1.
__device__ __forceinline__ void to_p(unsigned int (*p)[4], const float* s) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
        p[kk][0] = pack2(s[8 * kk], s[8 * kk + 1]);
        p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

extern "C" __global__ void __launch_bounds__(FT, 1)
flash_prefill(const kt* q, unsigned long long k_plane, unsigned long long v_plane, const int* pos,
              const int* tab_off, const unsigned int* tables, const int* tiles, int bs, long long s_blk,
              long long s_tok, long long s_head, wt* out, int H, int KVH, float scale_log2 PERSIST_ARG) {
    GRID_DEP_WAIT();
    extern __shared__ __align__(1024) unsigned char flash_smem[];
    const unsigned int base = (smem_addr(flash_smem) + 1023) & ~1023u;
    const unsigned int sq = base, sk = base + SM_K, sv = base + SM_V, bar = base + SM_BAR;
#define FULL_K(s) (bar + 8 * (s))
#define FULL_V(s) (bar + 8 * (NST + (s)))
#define EMPTY_K(s) (bar + 8 * (2 * NST + (s)))
#define EMPTY_V(s) (bar + 8 * (3 * NST + (s)))
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; s++) {
            mbar_init(FULL_K(s), 128);  // every copier thread's cp.async arrival
            mbar_init(FULL_V(s), 128);
            mbar_init(EMPTY_K(s), 8);  // one per warp of the two warpgroups
            mbar_init(EMPTY_V(s), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // The block's work items: (head, tile) pairs, item w being head w % H of the tile with the
    // (w / H + 1)-th most keys. A persistent block takes every gridDim.x-th item from its own;
    // otherwise the block is one item, (blockIdx.x, gridDim.y - 1 - blockIdx.y).
#if PERSIST
    const int total = H * ntiles, first = blockIdx.x, stride = gridDim.x;
#else
    const int ntiles = gridDim.y, total = H * ntiles, first = blockIdx.y * H + blockIdx.x, stride = total;
#endif
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (warp < 4) {
        // The copier. A thread copies the same 16 bytes of every CSTEP-th key row, so its
        // place in a tile (column half, row, swizzled chunk) is fixed: rows CSTEP apart share
        // their row % 8.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(COPY_REGS));
        const int key0 = threadIdx.x / (HD / 8), c8 = threadIdx.x % (HD / 8);
        const unsigned int at0 = (c8 >> 3) * (BC * 128) + key0 * 128 + (((c8 & 7) ^ (key0 & 7)) * 16);
        const int shift = block_shift(bs);
        const unsigned int sblk = (unsigned int)s_blk, stok = (unsigned int)s_tok;
        int it = 0;  // K/V tiles copied so far: its buffer is it % NST, that buffer's use it / NST
        for (int w = first; w < total; w += stride) {
            const int ti = 2 * (ntiles - 1 - w / H), t0 = tiles[ti], n = tiles[ti + 1];
            const int kh = (w % H) / (H / KVH), last = pos[t0] + n - 1, nkb = last / BC + 1;
            const kt* Kc = (const kt*)k_plane + (long long)kh * s_head + c8 * 8;
            const kt* Vc = (const kt*)v_plane + (long long)kh * s_head + c8 * 8;
            const unsigned int* tab = tables + tab_off[t0];
            for (int kb = 0; kb < nkb; kb++, it++) {
                const int st = it % NST, use = it / NST;
                // Each piece's cache block and place in it, for K and V alike.
                unsigned int b[CPER], in_blk[CPER];
#pragma unroll
                for (int i = 0; i < CPER; i++) {
                    int j = kb * BC + key0 + i * CSTEP, blk = key_block(j, bs, shift);
                    b[i] = j <= last ? tab[blk] : 0u;
                    in_blk[i] = (j - blk * bs) * stok;
                }
                // Once the warpgroups are done with the buffer's last tile: this tile's K, then V.
                auto fill = [&](unsigned int buf, const kt* src, unsigned int empty, unsigned int full) {
                    if (use > 0) mbar_wait(empty, (use - 1) & 1);
#pragma unroll
                    for (int i = 0; i < CPER; i++) {
                        unsigned long long off = (unsigned long long)b[i] * sblk + in_blk[i];
                        cp_async16(buf + st * KV_TILE + at0 + i * CSTEP * 128, src + off, kb * BC + key0 + i * CSTEP <= last);
                    }
                    cp_async_arrive(full);
                };
                fill(sk, Kc, EMPTY_K(st), FULL_K(st));
                fill(sv, Vc, EMPTY_V(st), FULL_V(st));
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(MMA_REGS));
    const int cw = (warp >> 2) - 1;  // this warpgroup: rows 64 · cw onwards of each tile
    const int g = lane >> 2, tq = lane & 3;
    const int wr0 = cw * 64;
    const int r0 = wr0 + (warp & 3) * 16 + g, r1 = r0 + 8;
    const unsigned int qw = sq + cw * Q_WG;
    // With two warpgroups at work, each issues its products while the other works out its
    // softmax (FlashAttention 3's ping-pong, named barriers 3 and 4): a warpgroup waits for its
    // turn, issues, and hands the turn over; the first turn is the first warpgroup's. Turns
    // left over at the end of an item carry over to the next.
    if (PINGPONG && cw == 0) asm volatile("bar.arrive 3, 256;" ::: "memory");
    int it = 0;  // K/V tiles consumed so far, as the copier counts them
    for (int w = first; w < total; w += stride) {
        const int ti = 2 * (ntiles - 1 - w / H), t0 = tiles[ti], n = tiles[ti + 1];
        const int h = w % H, p0 = pos[t0], nkb = (p0 + n - 1) / BC + 1;
        const int lim0 = p0 + min(r0, n - 1), lim1 = p0 + min(r1, n - 1);
        const bool busy = wr0 < n;  // whether the warpgroup has a row to write
        // Both warpgroups walk every key tile (the first's last one may be all masked), so
        // they take the same number of turns.
        const int nkw = busy ? nkb : 0;
        const bool pingpong = PINGPONG && n > 64;

        if (busy) {
            // The warpgroup's Q rows (rows past the tile's end repeat its last), pre-scaled, in
            // the cache's type, swizzled as the K tiles. Its last item's products are done.
            for (int idx = threadIdx.x - 128 - cw * 128; idx < 64 * (HD / 8); idx += 128) {
                int r = idx / (HD / 8), c8 = idx % (HD / 8);
                float a[8];
                kld8(q + ((long long)(t0 + min(wr0 + r, n - 1)) * H + h) * HD + c8 * 8, a);
                unsigned int at = qw + (c8 >> 3) * (64 * 128) + r * 128 + (((c8 & 7) ^ (r & 7)) * 16);
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(at),
                             "r"(pack2(a[0] * scale_log2, a[1] * scale_log2)), "r"(pack2(a[2] * scale_log2, a[3] * scale_log2)),
                             "r"(pack2(a[4] * scale_log2, a[5] * scale_log2)), "r"(pack2(a[6] * scale_log2, a[7] * scale_log2))
                             : "memory");
            }
            fence_async();
            asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
        }

        float s[BC / 2], o[HD / 2];
        unsigned int p[BC / 16][4];
        float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
        if (nkw > 0) {
            mbar_wait(FULL_K(it % NST), (it / NST) & 1);
            fence_async();
            wgmma_fence();
            issue_qk(s, qw, sk + (it % NST) * KV_TILE);
            wgmma_wait<0>();
            pin<BC / 2>(s);
            mbar_release(EMPTY_K(it % NST), lane);
            mask_tile(s, 0, lim0, lim1, tq);
            float c0, c1;
            softmax_tile(s, m0, m1, l0, l1, c0, c1);
            to_p(p, s);
            for (int kb = 1; kb < nkw; kb++) {
                const int i = it + kb, st = i % NST, pst = (i - 1) % NST;
                mbar_wait(FULL_K(st), (i / NST) & 1);
                fence_async();
                if (pingpong) asm volatile("bar.sync %0, 256;" ::"r"(3 + cw) : "memory");
                wgmma_fence();
                issue_qk(s, qw, sk + st * KV_TILE);
                // The outputs so far move to the last tile's maxima while Q · Kᵀ runs.
                rescale(o, c0, c1);
                mbar_wait(FULL_V(pst), ((i - 1) / NST) & 1);
                fence_async();
                wgmma_fence();
                issue_pv(o, p, sv + pst * KV_TILE);
                if (pingpong) asm volatile("bar.arrive %0, 256;" ::"r"(4 - cw) : "memory");
                wgmma_wait<1>();  // Q · Kᵀ done; P · V runs on under the softmax
                pin<BC / 2>(s);
                mbar_release(EMPTY_K(st), lane);
                mask_tile(s, kb, lim0, lim1, tq);
                // Always taken (a running sum is never negative), but a branch: within one
                // block ptxas would hoist the wait below above the softmax, which then no
                // longer runs under P · V.
                if (l0 >= 0.f) softmax_tile(s, m0, m1, l0, l1, c0, c1);
                wgmma_wait<0>();
                pin<HD / 2>(o);
                pin<BC / 4>(&p[0][0]);
                mbar_release(EMPTY_V(pst), lane);
                to_p(p, s);
            }
            const int lst = (it + nkw - 1) % NST;
            rescale(o, c0, c1);
            mbar_wait(FULL_V(lst), ((it + nkw - 1) / NST) & 1);
            fence_async();
            wgmma_fence();
            issue_pv(o, p, sv + lst * KV_TILE);
            wgmma_wait<0>();
            pin<HD / 2>(o);
            mbar_release(EMPTY_V(lst), lane);
        }
        // A warpgroup without rows releases each tile once it has landed (that is, once the
        // copier is past every earlier use of its buffer).
        for (int kb = nkw; kb < nkb; kb++) {
            const int i = it + kb, st = i % NST, ph = (i / NST) & 1;
            mbar_wait(FULL_K(st), ph);
            mbar_release(EMPTY_K(st), lane);
            mbar_wait(FULL_V(st), ph);
            mbar_release(EMPTY_V(st), lane);
        }
        it += nkb;
        if (!busy) continue;
#pragma unroll
        for (int sh = 1; sh < 4; sh <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, sh);
            l1 += __shfl_xor_sync(0xffffffffu, l1, sh);
        }
        const float i0 = 1.f / l0, i1 = 1.f / l1;
        // A lane's two neighbouring columns as one word (even columns, rows of whole words).
        auto put = [&](int r, int c, float a, float b) {
            wt* wr = out + ((long long)(t0 + r) * H + h) * HD + c;
#if WT == 0
            wr[0] = a;
            wr[1] = b;
#else
            *(unsigned int*)wr = (unsigned int)wst(a) | ((unsigned int)wst(b) << 16);
#endif
        };
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            int c = d * 8 + 2 * tq;
            if (r0 < n) put(r0, c, o[4 * d] * i0, o[4 * d + 1] * i0);
            if (r1 < n) put(r1, c, o[4 * d + 2] * i1, o[4 * d + 3] * i1);
        }
    }
}

#endif
