use super::*;

#[test]
fn candle_errors_reach_clients_without_a_backtrace() {
    let inner = candle_core::Error::Msg("unknown magic 0x4c4c".into());
    let e = candle_core::Error::WithBacktrace {
        inner: Box::new(inner),
        backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
    }
    .with_path("/m/model.gguf");
    assert!(e.to_string().lines().count() > 1, "candle prints the backtrace itself");
    assert_eq!(candle_reason(&e), "/m/model.gguf: unknown magic 0x4c4c");
}

fn q8(rows: usize, cols: usize, seed: f32) -> QTensor {
    let values: Vec<f32> = (0..rows * cols).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
    let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, GgmlDType::Q8_0).expect("quantize")
}

fn dense(q: &QTensor) -> Vec<Vec<f32>> {
    q.dequantize(&Device::Cpu).expect("dequantize").to_vec2().expect("rows")
}

#[test]
fn quantized_rows_unpermute_as_the_dense_weight_does() {
    let q = q8(16, 64, 0.0);
    let expected = unpermute(&q.dequantize(&Device::Cpu).expect("dequantize"), 4).expect("unpermute");
    let got = unpermute_rows(&q, 4).expect("unpermute rows");
    assert_eq!(dense(&got), expected.to_vec2::<f32>().expect("rows"));
    assert!(unpermute_rows(&q, 3).is_err(), "16 rows are not 3 heads of pairs");
}

#[test]
fn quantized_parts_fuse_by_rows_and_mixed_parts_fall_back_to_dense() {
    let (a, b) = (q8(8, 64, 1.0), q8(4, 64, 2.0));
    let expected: Vec<Vec<f32>> = dense(&a).into_iter().chain(dense(&b)).collect();
    let quantized = HashMap::from([("a".to_owned(), a), ("b".to_owned(), b)]);
    let path = Path::new("m.gguf");
    let mut src = Source { tensors: HashMap::new(), quantized, file: path, dtype: DType::F32 };
    let parts = [("a".to_owned(), [8, 64]), ("b".to_owned(), [4, 64])];
    let fused = src.linear(&parts).expect("fused");
    assert!(matches!(fused, Linear::Quantized(_) | Linear::Q8_0(_)), "not quantized");
    // The weight's rows, as a product with the identity gives them back (`x @ wᵀ` = `wᵀ`).
    let identity = Tensor::eye(64, DType::F32, &Device::Cpu).expect("identity");
    let transposed = fused.forward(&identity, &RowKinds::Dense).expect("product");
    let rows: Vec<Vec<f32>> = transposed.t().expect("t").to_vec2().expect("rows");
    assert_eq!(rows, expected);

    let dense_b = Tensor::zeros((4, 64), DType::F32, &Device::Cpu).expect("zeros");
    let mut src = Source {
        tensors: HashMap::from([("b".to_owned(), dense_b)]),
        quantized: HashMap::from([("a".to_owned(), q8(8, 64, 1.0))]),
        file: path,
        dtype: DType::F32,
    };
    let Linear::Dense(w) = src.linear(&parts).expect("mixed") else { panic!("not dense") };
    assert_eq!(w.dims(), [12, 64]);
    let wrong = [("a".to_owned(), [8, 32])];
    let mut src = Source {
        tensors: HashMap::new(),
        quantized: HashMap::from([("a".to_owned(), q8(8, 64, 1.0))]),
        file: path,
        dtype: DType::F32,
    };
    assert!(src.linear(&wrong).is_err(), "a part of another shape is refused");
}
