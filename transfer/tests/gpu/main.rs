//! GPU page conversion against the CPU reference, and GPU-to-GPU handoffs (CUDA IPC, NIXL
//! VRAM; `transport`), on a real NVIDIA GPU (`XINF_TEST_GPU=1`, feature `cuda`). Without the
//! variable, or without a GPU, the tests say so and skip.

#![cfg(feature = "cuda")]
#![allow(missing_docs)]

mod transport;

use std::time::Instant;
use xinf_test_util::Rng;
use xinf_transfer::gpu::{GpuError, GpuPages};
use xinf_transfer::{Direction, KvLayout, LayoutDescriptor, PAGE_TOKENS, copy_pages};

/// The kernel on GPU 0, or `None` (with a loud note) when GPU tests are not asked for.
fn gpu() -> Option<GpuPages> {
    if !xinf_test_util::gpu_tests_enabled("the transfer crate's GPU tests") {
        return None;
    }
    match GpuPages::new(0) {
        Ok(g) => Some(g),
        Err(e @ (GpuError::NoDriver | GpuError::NoNvrtc)) => panic!("XINF_TEST_GPU=1 but {e}"),
        Err(e) => panic!("{e}"),
    }
}

const POISON: u16 = 0xDEAD;

/// A cache of `blocks` blocks in `layout`, filled with poison, and a shuffled table for
/// `len` tokens (never block 0).
fn cache(
    layout: KvLayout,
    layers: usize,
    heads: usize,
    dim: usize,
    len: usize,
    blocks: usize,
    seed: u64,
) -> (LayoutDescriptor, Vec<Vec<u16>>, Vec<u32>) {
    let desc = layout.describe(layers, heads, dim, blocks).expect("valid layout");
    let regions = vec![vec![POISON; desc.region_len]; desc.num_regions];
    let mut ids: Vec<u32> = (1..blocks as u32).collect();
    let mut x = Rng::new(seed | 1);
    for i in (1..ids.len()).rev() {
        ids.swap(i, (x.next_u64() % (i as u64 + 1)) as usize);
    }
    ids.truncate(len.div_ceil(layout.block_size));
    (desc, regions, ids)
}

fn bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn words(v: &[u8]) -> Vec<u16> {
    v.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Every layout pair at 65/129/193 tokens, with the smallest destination cache that holds the
/// sequence and a large one: GPU gather equals the CPU gather bit for bit, GPU scatter into
/// the other layout equals the CPU scatter bit for bit (so every element outside the sequence
/// keeps its poison), and gathering again gives the same pages.
#[test]
fn gpu_conversion_matches_the_cpu_in_every_layout_pair() {
    let Some(g) = gpu() else { return };
    let stream = g.stream().clone();
    let (layers, heads, dim) = (2, 3, 64);
    let layouts = KvLayout::all_supported();
    let mut checked = 0;
    for (si, src_layout) in layouts.iter().enumerate() {
        for (di, dst_layout) in layouts.iter().enumerate() {
            for len in [65usize, 129, 193] {
                for spare in [0usize, 40] {
                    let seed = (si * 1000 + di * 10 + len) as u64;
                    // Source: the sequence's values through the source layout.
                    let src_blocks = len.div_ceil(src_layout.block_size) + 2;
                    let (sdesc, mut sregions, stable) =
                        cache(*src_layout, layers, heads, dim, len, src_blocks, seed);
                    let mut x = Rng::new(seed.wrapping_mul(0x9e37_79b9) | 1);
                    for r in &mut sregions {
                        for w in r.iter_mut() {
                            *w = (x.next_u64() & 0xffff) as u16;
                        }
                    }
                    let count = len.div_ceil(PAGE_TOKENS);
                    let page_words = 2 * layers * PAGE_TOKENS * heads * dim;
                    let mut cpu_pages = vec![0u16; count * page_words];
                    {
                        let mut views: Vec<&mut [u16]> =
                            sregions.iter_mut().map(|r| r.as_mut_slice()).collect();
                        copy_pages(
                            Direction::Gather,
                            &sdesc,
                            &mut views,
                            &stable,
                            len,
                            0..count,
                            &mut cpu_pages,
                        );
                    }
                    let dev_src: Vec<_> =
                        sregions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect();
                    let mut dev_pages = stream.alloc_zeros::<u8>(count * page_words * 2).expect("alloc");
                    g.gather(&sdesc, 2, &dev_src, &stable, len, 0..count, &mut dev_pages).expect("gather");
                    let gpu_pages = words(&stream.clone_dtoh(&dev_pages).expect("download"));
                    assert_eq!(gpu_pages, cpu_pages, "gather {src_layout} at {len} tokens");

                    // Destination: minimal (no spare block) or roomy, poisoned.
                    let dst_blocks = len.div_ceil(dst_layout.block_size) + 1 + spare;
                    let (ddesc, mut dregions, dtable) =
                        cache(*dst_layout, layers, heads, dim, len, dst_blocks, seed ^ 7);
                    let mut dev_dst: Vec<_> =
                        dregions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect();
                    g.scatter(&ddesc, 2, &mut dev_dst, &dtable, len, 0..count, &dev_pages).expect("scatter");
                    {
                        let mut views: Vec<&mut [u16]> =
                            dregions.iter_mut().map(|r| r.as_mut_slice()).collect();
                        copy_pages(
                            Direction::Scatter,
                            &ddesc,
                            &mut views,
                            &dtable,
                            len,
                            0..count,
                            &mut cpu_pages,
                        );
                    }
                    for (i, (dev, cpu)) in dev_dst.iter().zip(&dregions).enumerate() {
                        let got = words(&stream.clone_dtoh(dev).expect("download"));
                        assert!(
                            got == *cpu,
                            "scatter {src_layout} → {dst_layout} at {len} tokens, region {i}"
                        );
                    }
                    // And back: the destination gathers to the same pages.
                    let mut again = stream.alloc_zeros::<u8>(count * page_words * 2).expect("alloc");
                    g.gather(&ddesc, 2, &dev_dst, &dtable, len, 0..count, &mut again).expect("gather");
                    assert_eq!(words(&stream.clone_dtoh(&again).expect("download")), gpu_pages);
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} GPU conversions matched the CPU bit for bit");
}

/// A head dimension whose rows are not a multiple of 16 bytes takes the byte path.
#[test]
fn gpu_conversion_handles_unaligned_rows() {
    let Some(g) = gpu() else { return };
    let stream = g.stream().clone();
    let layout = KvLayout::all_supported()[0];
    let (layers, heads, dim, len) = (1, 2, 5, 70);
    let (desc, mut regions, table) =
        cache(layout, layers, heads, dim, len, len.div_ceil(layout.block_size) + 2, 3);
    for (i, r) in regions.iter_mut().enumerate() {
        for (j, w) in r.iter_mut().enumerate() {
            *w = (i * 31 + j) as u16;
        }
    }
    let count = len.div_ceil(PAGE_TOKENS);
    let mut cpu = vec![0u16; count * 2 * layers * PAGE_TOKENS * heads * dim];
    {
        let mut views: Vec<&mut [u16]> = regions.iter_mut().map(|r| r.as_mut_slice()).collect();
        copy_pages(Direction::Gather, &desc, &mut views, &table, len, 0..count, &mut cpu);
    }
    let dev: Vec<_> = regions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect();
    let mut pages = stream.alloc_zeros::<u8>(cpu.len() * 2).expect("alloc");
    g.gather(&desc, 2, &dev, &table, len, 0..count, &mut pages).expect("gather");
    assert_eq!(words(&stream.clone_dtoh(&pages).expect("download")), cpu);
}

/// Conversion throughput against a device-to-device copy of the same bytes, side by side:
/// a Qwen2.5-0.5B-shaped FP16 cache (24 layers, 2 KV heads, head dim 64), 16,384 tokens in
/// vLLM FlashAttention NHD, B=16, gathered into canonical pages and scattered into an SGLang
/// token pool. Prints the figures; asserts nothing about speed.
#[test]
fn gpu_conversion_bandwidth() {
    let Some(g) = gpu() else { return };
    let stream = g.stream().clone();
    let (layers, heads, dim, len) = (24, 2, 64, 16_384);
    let fa = KvLayout::all_supported()[0];
    let pool = KvLayout::all_supported().into_iter().find(|l| l.block_size == 1).unwrap_or(fa);
    let (sdesc, sregions, stable) = cache(fa, layers, heads, dim, len, len / fa.block_size + 1, 1);
    let (ddesc, dregions, dtable) = cache(pool, layers, heads, dim, len, len + 1, 2);
    let dev_src: Vec<_> = sregions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect();
    let mut dev_dst: Vec<_> =
        dregions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect();
    let count = len / PAGE_TOKENS;
    let page_bytes = 2 * layers * PAGE_TOKENS * heads * dim * 2;
    let moved = (count * page_bytes) as f64;
    let mut pages = stream.alloc_zeros::<u8>(count * page_bytes).expect("alloc");
    let mut copy = stream.alloc_zeros::<u8>(count * page_bytes).expect("alloc");
    let time = |f: &mut dyn FnMut()| {
        f();
        g.synchronize().expect("sync");
        let mut samples = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            f();
            g.synchronize().expect("sync");
            samples.push(t.elapsed().as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    };
    let gather =
        time(&mut || g.gather(&sdesc, 2, &dev_src, &stable, len, 0..count, &mut pages).expect("gather"));
    let scatter =
        time(&mut || g.scatter(&ddesc, 2, &mut dev_dst, &dtable, len, 0..count, &pages).expect("scatter"));
    let memcpy = time(&mut || stream.memcpy_dtod(&pages, &mut copy).expect("memcpy"));
    // A conversion reads and writes every byte once, like the copy.
    let gbs = |s: f64| moved / s / 1e9;
    eprintln!(
        "GPU conversion, {} MB ({len} tokens, Qwen2.5-0.5B shape, FP16), median of 20: gather FA-NHD-16 → pages {:.1} GB/s, \
         scatter pages → token pool {:.1} GB/s, device-to-device memcpy {:.1} GB/s; ratios {:.2} and {:.2}",
        moved / 1e6,
        gbs(gather),
        gbs(scatter),
        gbs(memcpy),
        memcpy / gather,
        memcpy / scatter,
    );
}
