use super::*;
use xinf_transfer::KvLayout;

fn layouts() -> Vec<KvLayout> {
    KvLayout::all_supported()
}

fn cache(layout: KvLayout, dtype: KvDtype) -> KvCache {
    let blocks = 512 / layout.block_size + 8;
    KvCache::new(layout.describe(2, 2, 8, blocks).expect("valid"), dtype)
}

fn rows(len: usize, salt: f32) -> Vec<f32> {
    (0..len * 2 * 8).map(|i| (i as f32 * 0.37 + salt).sin()).collect()
}

#[test]
fn block_zero_is_never_allocated() {
    for layout in layouts() {
        let mut c = cache(layout, KvDtype::F32);
        let mut table = Vec::new();
        assert!(c.ensure(&mut table, c.capacity_blocks() * layout.block_size));
        assert!(!table.contains(&0));
        assert_eq!(c.free_blocks(), 0);
        let mut more = Vec::new();
        assert!(!c.ensure(&mut more, 1), "no memory left");
        c.release(&mut table);
        assert_eq!(c.free_blocks(), c.capacity_blocks());
    }
}

/// What is written through one layout reads back identically, and canonical pages exported
/// from one layout import bit-exactly into every other.
#[test]
fn write_gather_and_pages_round_trip_across_layouts() {
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
        for len in [1usize, 63, 64, 65, 130] {
            let mut reference: Option<Vec<u8>> = None;
            for src_layout in layouts() {
                let mut src = cache(src_layout, dtype);
                let mut table = Vec::new();
                // Burn a few blocks so the table is not the identity.
                let mut junk = Vec::new();
                assert!(src.ensure(&mut junk, 3 * src_layout.block_size));
                assert!(src.ensure(&mut table, len));
                for layer in 0..2 {
                    for kv in 0..2 {
                        src.write(layer, kv, &table, 0, &rows(len, (layer * 2 + kv) as f32));
                    }
                }
                let mut out = Vec::new();
                src.gather(1, 1, &table, len, &mut out);
                let expect = rows(len, 3.0);
                for t in 0..len {
                    for head in 0..2 {
                        for e in 0..8 {
                            let got = out[(head * len + t) * 8 + e];
                            let want = KvElemOf::round(dtype, expect[(t * 2 + head) * 8 + e]);
                            assert_eq!(got.to_bits(), want.to_bits(), "{src_layout} {dtype}");
                        }
                    }
                }
                let pages = src.export_pages(&table, len, 0, len.div_ceil(PAGE_TOKENS));
                match &reference {
                    None => reference = Some(pages.clone()),
                    Some(r) => assert_eq!(r, &pages, "{src_layout}: pages differ"),
                }
                for dst_layout in layouts() {
                    let mut dst = cache(dst_layout, dtype);
                    let mut t2 = Vec::new();
                    assert!(dst.ensure(&mut t2, len));
                    dst.import_pages(&t2, len, &pages);
                    assert_eq!(dst.export_pages(&t2, len, 0, len.div_ceil(PAGE_TOKENS)), pages);
                }
            }
        }
    }
}

struct KvElemOf;
impl KvElemOf {
    fn round(dtype: KvDtype, v: f32) -> f32 {
        match dtype {
            KvDtype::F32 => v,
            KvDtype::F16 => f16::from_f32(v).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }
}

/// Decode attention read through every layout and element type, over one to three chunks of
/// positions: the same as softmax attention over the gathered rows (in F64), and each
/// sequence's result bit for bit the same alone as among others (which also moves it from the
/// calling thread to the pool), whichever build of its loops runs.
#[test]
fn decode_attention_is_softmax_attention_and_batch_invariant() {
    let (heads, d) = (4, 8);
    let lens = [1usize, 65, 130, 260];
    let q: Vec<f32> = (0..lens.len() * heads * d).map(|i| (i as f32 * 0.71).cos()).collect();
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
        for layout in layouts() {
            let mut c = cache(layout, dtype);
            let mut tables = Vec::new();
            for (s, &len) in lens.iter().enumerate() {
                let mut table = Vec::new();
                assert!(c.ensure(&mut table, len));
                for kv in 0..2 {
                    c.write(1, kv, &table, 0, &rows(len, (s * 2 + kv) as f32));
                }
                tables.push(table);
            }
            let queries: Vec<DecodeQuery<'_>> =
                tables.iter().zip(lens).map(|(table, len)| DecodeQuery { table, len }).collect();
            let scale = 0.35;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut together = vec![0f32; q.len()];
            c.attend_decode(1, &queries, &q, heads, scale, &mut together);
            // The loops built for AVX2 and for the baseline target give the same bits.
            for wide in [false, true].into_iter().filter(|&w| !w || super::attend::avx2()) {
                let mut built = vec![0f32; q.len()];
                c.attend_decode_on(1, &queries, &q, heads, scale, &mut built, wide);
                assert_eq!(bits(&built), bits(&together), "{layout} {dtype} wide {wide}");
            }
            for (s, query) in queries.iter().enumerate() {
                let span = s * heads * d..(s + 1) * heads * d;
                let mut alone = vec![0f32; heads * d];
                c.attend_decode(1, std::slice::from_ref(query), &q[span.clone()], heads, scale, &mut alone);
                assert_eq!(bits(&alone), bits(&together[span.clone()]), "{layout} {dtype} sequence {s}");
                let (mut k, mut v) = (Vec::new(), Vec::new());
                c.gather(1, 0, query.table, query.len, &mut k);
                c.gather(1, 1, query.table, query.len, &mut v);
                let len = query.len;
                for h in 0..heads {
                    let (kh, qh) = (h / 2, &q[span.start + h * d..span.start + (h + 1) * d]);
                    let key = |t: usize| &k[(kh * len + t) * d..(kh * len + t + 1) * d];
                    let score = |t: usize| {
                        scale as f64 * qh.iter().zip(key(t)).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                    };
                    let max = (0..len).map(score).fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = (0..len).map(|t| (score(t) - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for e in 0..d {
                        let want: f64 =
                            (0..len).map(|t| weights[t] / total * v[(kh * len + t) * d + e] as f64).sum();
                        let got = alone[h * d + e] as f64;
                        assert!((got - want).abs() < 1e-5, "{layout} {dtype} s{s} h{h}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
