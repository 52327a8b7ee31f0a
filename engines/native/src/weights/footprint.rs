//! What a GGUF model's weights take in a CPU replica, known before they are read, so that a
//! replica is admitted by the memory it will hold.

use super::{GGUF_NAMES, held_type, reblocked_type};
use candle_core::quantized::{GgmlDType, gguf_file};
use std::collections::HashSet;
use xinf_models::ModelConfig;

/// The bytes a CPU replica holds for a GGUF file's weights with the projections kept in their
/// quantized blocks, from the file's tensor index alone (F32 throughout would count a Q4_1
/// file's projections 6.4× over). Mirrors [`super::load_gguf`] and `build`: a projection stays
/// in blocks where all its fused parts are held in one block type, and is F32 otherwise; the
/// embedding is F32 (looked up dense), and a tied head a block copy of it; norms, biases and
/// whatever else the file holds are F32.
pub(crate) fn gguf_held_bytes(content: &gguf_file::Content, cfg: &ModelConfig) -> u64 {
    let names = &GGUF_NAMES;
    let dims = |name: &str| content.tensor_infos.get(name).map(|t| (t.ggml_dtype, t.shape.dims().to_vec()));
    let f32_bytes = |d: &[usize]| d.iter().product::<usize>() as u64 * 4;
    let block_bytes =
        |t: GgmlDType, d: &[usize]| (d.iter().product::<usize>() / t.block_size() * t.type_size()) as u64;
    let held = |name: &str| dims(name).and_then(|(t, d)| held_type(name, t, &d).map(|h| (h, d)));
    // A projection of fused parts: in blocks where every part is held in one type, else F32.
    let projection = |parts: &[String]| -> u64 {
        let held: Vec<_> = parts.iter().map(|p| held(p)).collect();
        let first = held.first().and_then(|h| h.as_ref().map(|(t, _)| *t));
        if held.iter().all(|h| h.is_some() && h.as_ref().map(|(t, _)| *t) == first) {
            held.iter().flatten().map(|(t, d)| block_bytes(*t, d)).sum()
        } else {
            parts.iter().filter_map(|p| dims(p)).map(|(_, d)| f32_bytes(&d)).sum()
        }
    };
    let mut counted = HashSet::new();
    let mut total = 0;
    for i in 0..cfg.num_layers {
        for parts in [&["q", "k", "v"][..], &["o"], &["gate", "up"], &["down"]] {
            let parts: Vec<String> = parts.iter().map(|p| (names.layer)(i, p)).collect();
            total += projection(&parts);
            counted.extend(parts);
        }
    }
    if !cfg.tie_word_embeddings {
        total += projection(&[names.lm_head.to_owned()]);
        counted.insert(names.lm_head.to_owned());
    }
    if let Some((t, d)) = dims(names.embed) {
        total += f32_bytes(&d);
        if cfg.tie_word_embeddings
            && let Some((held, _)) = held(names.embed)
        {
            total += block_bytes(reblocked_type(t, &d).unwrap_or(held), &d);
        }
        counted.insert(names.embed.to_owned());
    }
    let rest = content.tensor_infos.iter().filter(|(name, _)| !counted.contains(*name));
    total + rest.map(|(_, t)| f32_bytes(t.shape.dims())).sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::{Linear, Weights, load_gguf};
    use candle_core::quantized::QTensor;
    use candle_core::{DType, Device, Tensor};

    fn tensor(dims: &[usize], t: GgmlDType, seed: f32) -> QTensor {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
        let dense = Tensor::from_vec(values, dims, &Device::Cpu).expect("tensor");
        QTensor::quantize(&dense, t).expect("quantize")
    }

    /// The bytes loaded weights hold: dense tensors' elements (F32), quantized ones' blocks; a
    /// tied dense head is the embedding itself.
    fn held(w: &Weights, tied: bool) -> u64 {
        let dense = |t: &Tensor| t.elem_count() as u64 * 4;
        let linear = |l: &Linear| match l {
            Linear::Dense(t) => dense(t),
            Linear::Quantized(q) => q.storage_size_in_bytes() as u64,
            Linear::Q4_1(p) => p.block_bytes() as u64,
            Linear::Q8_0(p) => p.block_bytes() as u64,
        };
        let mut total = dense(&w.embed) + dense(&w.final_norm);
        for l in &w.layers {
            total += dense(&l.attn_norm) + dense(&l.mlp_norm);
            total += [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down].into_iter().map(linear).sum::<u64>();
            total += [&l.bqkv, &l.q_norm, &l.k_norm].into_iter().flatten().map(dense).sum::<u64>();
        }
        if !(tied && matches!(w.lm_head, Linear::Dense(_))) {
            total += linear(&w.lm_head);
        }
        total
    }

    /// A GGUF file of `crate::test_support::small_llama`'s shapes (2 layers, hidden 64, 4 heads
    /// and 2 KV heads of 16, MLP 128, vocabulary 100) in the given block types, and its config.
    fn model(
        dir: &std::path::Path,
        embed: GgmlDType,
        head: Option<GgmlDType>,
    ) -> (std::path::PathBuf, ModelConfig) {
        use GgmlDType::{F32, Q4_0, Q4_1, Q5_0, Q8_0};
        let mut tensors = vec![
            ("token_embd.weight".to_owned(), tensor(&[100, 64], embed, 0.0)),
            ("output_norm.weight".to_owned(), tensor(&[64], F32, 1.0)),
        ];
        // Layer 0 mixes block types inside its fused projections (Q/K Q4_0, V Q8_0: F32; gate
        // Q4_1 and up Q5_0, which the CPU re-blocks as Q8_0 unless it runs the Q4_1 kernel);
        // layer 1 is Q8_0 throughout.
        let types = [[Q4_0, Q4_0, Q8_0, Q5_0, Q4_1, Q5_0, Q8_0], [Q8_0; 7]];
        for (i, t) in types.iter().enumerate() {
            let parts =
                [("attn_q", [64, 64]), ("attn_k", [32, 64]), ("attn_v", [32, 64]), ("attn_output", [64, 64])];
            let mlp = [("ffn_gate", [128, 64]), ("ffn_up", [128, 64]), ("ffn_down", [64, 128])];
            for (j, (name, dims)) in parts.into_iter().chain(mlp).enumerate() {
                tensors.push((format!("blk.{i}.{name}.weight"), tensor(&dims, t[j], (i * 10 + j) as f32)));
            }
            tensors.push((format!("blk.{i}.attn_norm.weight"), tensor(&[64], F32, 2.0)));
            tensors.push((format!("blk.{i}.ffn_norm.weight"), tensor(&[64], F32, 3.0)));
        }
        if let Some(t) = head {
            tensors.push(("output.weight".to_owned(), tensor(&[100, 64], t, 4.0)));
        }
        let path = dir.join("m.gguf");
        let mut file = std::fs::File::create(&path).expect("create");
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        gguf_file::write(&mut file, &[], &refs).expect("write gguf");
        let cfg = ModelConfig { tie_word_embeddings: head.is_none(), ..crate::test_support::small_llama() };
        (path, cfg)
    }

    #[test]
    fn a_gguf_files_footprint_is_what_its_weights_hold_once_loaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (embed, head) in
            [(GgmlDType::Q8_0, None), (GgmlDType::Q4_1, None), (GgmlDType::Q5_0, Some(GgmlDType::Q4_0))]
        {
            let (path, cfg) = model(dir.path(), embed, head);
            let mut f = std::fs::File::open(&path).expect("open");
            let content = gguf_file::Content::read(&mut f).expect("index");
            let weights = load_gguf(&path, &content, &cfg, DType::F32, true).expect("load");
            let loaded = held(&weights, cfg.tie_word_embeddings);
            assert_eq!(gguf_held_bytes(&content, &cfg), loaded, "embedding {embed:?}, head {head:?}");
            // Layer 0's Q/K/V are mixed, so F32; most of the rest stays in blocks, well under F32.
            assert!(matches!(weights.layers[0].wqkv, Linear::Dense(_)));
            assert!(matches!(weights.layers[0].w_gate_up, Linear::Quantized(_)) == !crate::q4_1::supported());
            assert!(loaded < crate::memory::param_count(&cfg) * 4 * 7 / 10, "{loaded} bytes");
        }
    }
}
