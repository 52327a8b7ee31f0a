use super::*;
use crate::widened::F32_ROWS;
use candle_core::Device;

fn packed(rows: usize, cols: usize) -> (QTensor, Packed) {
    let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).expect("test tensor");
    let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("test tensor");
    assert!(applies(&q));
    let p = Packed::new(&q).expect("packed");
    (q, p)
}

/// Against the block math in plain F32 on the same quantized activations: the kernel's
/// only difference is the order of its sums. 37 rows: a last group of five.
#[test]
fn matches_the_block_math() {
    if !supported() {
        eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
        return;
    }
    let (rows, cols, m) = (37, 96, 6);
    let (q, p) = packed(rows, cols);
    let x = Tensor::randn(0f32, 1.0, (m, cols), &Device::Cpu).expect("test tensor");
    let got = p.matmul(&x).expect("test tensor").to_vec2::<f32>().expect("test tensor");
    let xs = x.flatten_all().expect("test tensor").to_vec1::<f32>().expect("test tensor");
    let acts = quantize_rows(&xs, m, cols);
    let wd = q.dequantize(&Device::Cpu).expect("test tensor").to_vec2::<f32>().expect("test tensor");
    for (i, got_row) in got.iter().enumerate() {
        for (j, &g) in got_row.iter().enumerate() {
            // Σ over blocks of d_a·Σ (dequantized w)·q_a, i.e. the same product in F32.
            let mut want = 0f32;
            for b in 0..cols / QK {
                let [d_a, _] = acts.ds[i * acts.blocks + b];
                for e in 0..QK {
                    want += wd[j][b * QK + e] * d_a * acts.qs[i * cols + b * QK + e] as f32;
                }
            }
            assert!((g - want).abs() <= 1e-3 * (1.0 + want.abs()), "({i}, {j}): {g} vs {want}");
        }
    }
    // And close to the F32 product of the dequantized weights (activation rounding only).
    let exact = x
        .matmul(&q.dequantize(&Device::Cpu).expect("test tensor").t().expect("test tensor"))
        .expect("test tensor");
    let exact = exact.to_vec2::<f32>().expect("test tensor");
    let spread = exact.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
    for (g, e) in got.iter().flatten().zip(exact.iter().flatten()) {
        assert!((g - e).abs() < 0.02 * spread, "{g} vs {e}");
    }
}

/// Repacking keeps every block: each row's blocks read back as the file stored them.
#[test]
fn packing_keeps_every_block() {
    if !supported() {
        eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
        return;
    }
    let (rows, cols) = (21, 64);
    let (q, p) = packed(rows, cols);
    let data = q.data().expect("blocks");
    for row in 0..rows {
        for b in 0..cols / QK {
            let stored = &data[(row * cols / QK + b) * BLOCK_BYTES..][..BLOCK_BYTES];
            let (dm, nibbles) = p.block(row, b);
            assert_eq!((&dm[..], nibbles), (&stored[..4], &stored[4..]), "row {row}, block {b}");
        }
    }
    assert_eq!((p.rows(), p.elem_count(), p.block_bytes()), (rows, rows * cols, data.len()));
}

/// Bit for bit candle's F32 product of the dequantized weights where the weight rows come in
/// whole work items, within rounding otherwise (the GEMM sums a wider slice in another
/// order); each row the same whatever rows share the call, on both sides of 64 rows.
#[test]
fn f32_product_is_candles_on_the_dequantized_weights() {
    if !supported() {
        eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
        return;
    }
    let values = |t: &Tensor| -> Vec<f32> { t.flatten_all().expect("flat").to_vec1().expect("values") };
    let bits = |t: &Tensor| -> Vec<u32> { values(t).iter().map(|v| v.to_bits()).collect() };
    let cols = 1536;
    for rows in [2 * F32_ROWS, 300] {
        let (q, p) = packed(rows, cols);
        let wd = q.dequantize(&Device::Cpu).expect("dequantize");
        let x = Tensor::randn(0f32, 1.0, (80, cols), &Device::Cpu).expect("test tensor");
        let ours = p.matmul_f32(&x).expect("product");
        let candle = x.matmul(&wd.t().expect("t")).expect("product");
        if rows.is_multiple_of(F32_ROWS) {
            assert_eq!(bits(&ours), bits(&candle));
        }
        for (a, b) in values(&ours).iter().zip(values(&candle)) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
        for (first, n) in [(4, 1), (2, 3), (0, 6), (10, 64), (7, 70)] {
            let part = p.matmul_f32(&x.narrow(0, first, n).expect("rows")).expect("product");
            assert_eq!(bits(&part), bits(&ours.narrow(0, first, n).expect("rows")), "{rows}: {n} rows");
        }
    }
}

/// A row's result is the same alone as among others, whichever tile shape computed it,
/// and in a last group that is not whole.
#[test]
fn rows_do_not_depend_on_the_batch() {
    if !supported() {
        eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
        return;
    }
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all().expect("flat").to_vec1::<f32>().expect("values").iter().map(|v| v.to_bits()).collect()
    };
    for cols in [128, 96] {
        let (_, p) = packed(37, cols);
        let x = Tensor::randn(0f32, 1.0, (7, cols), &Device::Cpu).expect("test tensor");
        let all = p.matmul(&x).expect("product");
        for r in 0..7 {
            let alone = p.matmul(&x.narrow(0, r, 1).expect("row")).expect("product");
            assert_eq!(bits(&alone), bits(&all.narrow(0, r, 1).expect("row")), "{cols} columns, row {r}");
        }
    }
}

#[test]
fn other_block_types_are_left_to_candle() {
    let w = Tensor::randn(0f32, 1.0, (4, 64), &Device::Cpu).expect("test tensor");
    let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("test tensor");
    assert!(!applies(&q));
    assert!(Packed::new(&q).is_err());
}

/// AVX-512 VNNI's integer products give AVX2's sums bit for bit (a machine may have either;
/// the results must not depend on which), with activations at the ends of their range.
#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_and_avx2_give_the_same_sums() {
    if !supported() || !vnni() {
        eprintln!("SKIPPED: this CPU has no AVX-512 VNNI (or no AVX2/FMA/F16C)");
        return;
    }
    let (rows, cols, m) = (16, 256, 4);
    let (_, p) = packed(rows, cols);
    // Every eighth value large, so each block's scale makes it ±127.
    let xs: Vec<f32> =
        (0..m * cols).map(|i| if i % 8 == 0 { 50.0 } else { (i as f32 * 0.37).sin() }).collect();
    let acts = quantize_rows(&xs, m, cols);
    assert!(acts.qs.iter().any(|&q| q == 127 || q == -127));
    for g in 0..rows / GROUP {
        let (mut a4, mut v4) = ([[0f32; GROUP]; 4], [[0f32; GROUP]; 4]);
        let (mut a1, mut v1) = ([[0f32; GROUP]; 1], [[0f32; GROUP]; 1]);
        // SAFETY: both features checked above; whole groups; rows 0..4 exist.
        unsafe {
            group_avx2::<4>(p.group(g), &acts, 0, &mut a4);
            group_vnni::<4>(p.group(g), &acts, 0, &mut v4);
            group_avx2::<1>(p.group(g), &acts, 3, &mut a1);
            group_vnni::<1>(p.group(g), &acts, 3, &mut v1);
        }
        let bits = |v: &[[f32; GROUP]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a4), bits(&v4), "group {g}, four rows");
        assert_eq!(bits(&a1), bits(&v1), "group {g}, one row");
        assert_eq!(bits(&a1), bits(&a4[3..]), "group {g}: a row alone as in a tile");
    }
}
