use super::*;

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().expect("flat").to_vec1().expect("values")
}

fn bits(t: &Tensor) -> Vec<u32> {
    values(t).iter().map(|v| v.to_bits()).collect()
}

/// A prompt's rows against block weights widened a slice at a time: bit for bit candle's
/// product of the whole dequantized matrix where the slices are whole (and a lone row as the
/// one of two that path takes), within rounding otherwise; each row the same whatever rows
/// share the call. The types GGUF files use most, in their block sizes of 32 and 256.
#[test]
fn block_products_are_candles_on_the_dequantized_weights() {
    let cols = 768;
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4K, GgmlDType::Q6K] {
        for rows in [2 * F32_ROWS, 300, 100] {
            let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).expect("weights");
            let q = QTensor::quantize(&w, dtype).expect("quantize");
            let wd = q.dequantize(&Device::Cpu).expect("dequantize");
            let x = Tensor::randn(0f32, 1.0, (80, cols), &Device::Cpu).expect("input");
            let ours = quantized(&q, &x).expect("a block type").expect("product");
            let candle = x.matmul(&wd.t().expect("t")).expect("product");
            if rows.is_multiple_of(F32_ROWS) {
                assert_eq!(bits(&ours), bits(&candle), "{dtype:?}, {rows} rows");
                let one = x.narrow(0, 5, 1).expect("row");
                let pair = Tensor::cat(&[&one, &one], 0).expect("pair");
                let before = pair.matmul(&wd.t().expect("t")).expect("product").narrow(0, 0, 1).expect("row");
                let lone = quantized(&q, &one).expect("a block type").expect("product");
                assert_eq!(bits(&lone), bits(&before), "{dtype:?}, {rows} rows: one row");
            }
            for (a, b) in values(&ours).iter().zip(values(&candle)) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{dtype:?}: {a} vs {b}");
            }
            for (first, n) in [(4, 1), (2, 3), (0, 6), (10, 64), (7, 70)] {
                let part = quantized(&q, &x.narrow(0, first, n).expect("rows")).expect("a block type");
                let part = part.expect("product");
                let whole = ours.narrow(0, first, n).expect("rows");
                assert_eq!(bits(&part), bits(&whole), "{dtype:?}, {rows} rows: {n} of them");
            }
        }
    }
}

#[test]
fn types_without_blocks_are_left_to_the_caller() {
    let w = Tensor::randn(0f32, 1.0, (130, 64), &Device::Cpu).expect("weights");
    let x = Tensor::randn(0f32, 1.0, (2, 64), &Device::Cpu).expect("input");
    for dtype in [GgmlDType::F32, GgmlDType::F16] {
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        assert!(quantized(&q, &x).is_none(), "{dtype:?}");
    }
}
