use super::*;
use crate::weights::{LayerWeights, Linear};
use candle_core::quantized::{GgmlDType, QTensor};
use xinf_engine::KvDtype;
use xinf_transfer::KvLayout;

fn values(n: usize, salt: f32, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.61 + salt).sin() * 1.7 + (i as f32 * 0.13).cos()) * scale).collect()
}

fn tensor(shape: &[usize], salt: f32, scale: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, salt, scale), shape, &Device::Cpu).expect("tensor")
}

fn quantized(rows: usize, cols: usize, salt: f32, dtype: GgmlDType) -> Linear {
    let t = tensor(&[rows, cols], salt, 0.2);
    Linear::blocks(QTensor::quantize(&t, dtype).expect("quantize")).expect("blocks")
}

/// A model of `cfg`'s shape with projections in Q4_1 and a Q8_0 head, as the default GGUF
/// loads, or all dense (`dense`), where a difference in the last bit of any activation reaches
/// the logits (an 8-bit product's input rounding hides most); biases and Q/K norms where `cfg`
/// has them.
fn model(cfg: &ModelConfig, dense: bool) -> CpuModel {
    let (hidden, d, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (q_out, kv_out) = (cfg.num_heads * d, cfg.kv_heads * d);
    let linear = |rows, cols, salt| match dense {
        true => Linear::Dense(tensor(&[rows, cols], salt, 0.2)),
        false => quantized(rows, cols, salt, GgmlDType::Q4_1),
    };
    let norm = |n, salt| (tensor(&[n], salt, 0.1) + 1.0).expect("norm");
    let layers = (0..cfg.num_layers)
        .map(|i| {
            let s = i as f32 * 10.0;
            LayerWeights {
                attn_norm: norm(hidden, s),
                wqkv: linear(q_out + 2 * kv_out, hidden, s + 1.0),
                bqkv: cfg.qkv_bias.then(|| tensor(&[q_out + 2 * kv_out], s + 2.0, 0.3)),
                q_norm: cfg.qk_norm.then(|| norm(d, s + 3.0)),
                k_norm: cfg.qk_norm.then(|| norm(d, s + 4.0)),
                wo: linear(hidden, q_out, s + 5.0),
                mlp_norm: norm(hidden, s + 6.0),
                w_gate_up: linear(2 * inter, hidden, s + 7.0),
                w_down: linear(hidden, inter, s + 8.0),
            }
        })
        .collect();
    let w = Weights {
        embed: tensor(&[cfg.vocab_size, hidden], 0.5, 1.0),
        layers,
        final_norm: norm(hidden, 0.7),
        lm_head: match dense {
            true => Linear::Dense(tensor(&[cfg.vocab_size, hidden], 0.9, 0.2)),
            false => quantized(cfg.vocab_size, hidden, 0.9, GgmlDType::Q8_0),
        },
    };
    CpuModel::new(cfg.clone(), w, 512).expect("model")
}

/// A decode step on slices gives the bits the general pass gives the same step, for a
/// Llama, a model with QKV biases, one with Q/K norms, and dense weights; three sequences of
/// different lengths, one of which wants no logits.
#[test]
fn decode_on_slices_is_the_general_pass_bit_for_bit() {
    let llama = crate::test_support::small_llama();
    let biased = ModelConfig { qkv_bias: true, ..llama.clone() };
    let normed = ModelConfig { qk_norm: true, ..llama.clone() };
    let cases = [
        (&llama, false),
        (&biased, false),
        (&normed, false),
        (&llama, true),
        (&biased, true),
        (&normed, true),
    ];
    for (cfg, dense) in cases {
        let mut m = model(cfg, dense);
        let layout = KvLayout::all_supported()[0];
        let desc = layout.describe(cfg.num_layers, cfg.kv_heads, cfg.head_dim, 64).expect("layout");
        let mut cache = KvCache::new(desc, KvDtype::F32);
        let lens = [3usize, 40, 70];
        let prompts: Vec<Vec<u32>> = lens
            .iter()
            .enumerate()
            .map(|(s, &n)| (0..n as u32).map(|i| (i * 7 + s as u32) % 100).collect())
            .collect();
        let mut tables = vec![Vec::new(); lens.len()];
        for (table, &n) in tables.iter_mut().zip(&lens) {
            assert!(cache.ensure(table, n + 4));
        }
        let prefill: Vec<Chunk<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| Chunk {
                tokens: p,
                start: 0,
                block_table: t,
                want_logits: true,
                all_logits: false,
                prompt_len: p.len(),
                argmax: false,
            })
            .collect();
        m.forward_chunks(&prefill, &mut cache).expect("prompts");
        for step in 0..3usize {
            let tokens: Vec<[u32; 1]> = (0..lens.len()).map(|s| [(step * 11 + s * 5) as u32 % 100]).collect();
            let chunks: Vec<Chunk<'_>> = (0..lens.len())
                .map(|s| Chunk {
                    tokens: &tokens[s],
                    start: lens[s] + step,
                    block_table: &tables[s],
                    want_logits: s != 1,
                    all_logits: false,
                    prompt_len: lens[s],
                    argmax: false,
                })
                .collect();
            assert!(decode::is_decode(&chunks));
            let general = m.forward_chunks(&chunks, &mut cache).expect("general pass");
            let slices = m.forward(&chunks, &mut cache).expect("slices");
            assert_eq!(general.len(), 2);
            let bits = |rows: &[Vec<f32>]| -> Vec<Vec<u32>> {
                rows.iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect()
            };
            assert_eq!(
                bits(&slices),
                bits(&general),
                "step {step}, qkv_bias {}, qk_norm {}, dense {dense}",
                cfg.qkv_bias,
                cfg.qk_norm
            );
        }
    }
}
