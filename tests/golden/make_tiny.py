#!/usr/bin/env python3
"""Generate tiny random-weight HF checkpoints for xinf golden tests.

usage: make_tiny.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR

Writes DIR/tiny-llama, DIR/tiny-qwen2, DIR/tiny-qwen3, each with config.json,
model.safetensors (float32), generation_config.json, tokenizer.json and
tokenizer_config.json (with the SmolLM2 chat template inline). Deterministic:
fixed seeds, weights re-drawn from a seeded torch.Generator in parameter order.

config.json rope formats (on purpose, so both parsers get exercised):
  tiny-llama, tiny-qwen3: legacy top-level "rope_theta" (+ "rope_scaling" for
      llama3), as in the real Llama 3.x / Qwen3 repos;
  tiny-qwen2: transformers-5 native "rope_parameters" only.
Each file is reloaded with transformers and checked to mean the same rope.
"""
import argparse
import shutil
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the network

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

STD = 0.15      # std of the layer matrices
EMB_STD = 0.5   # std of embed_tokens / lm_head: logit std ~4 (like the real model), so
                # top-1/top-2 gaps along greedy paths are mostly >> 1e-2


def common(vocab, tok):
    return dict(vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=2048, rms_norm_eps=1e-6, initializer_range=STD,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, dtype="float32")


def specs(vocab, tok):
    llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    # (name, class, config.json rope layout, weight seed, config). The seeds were picked so
    # that every greedy step of reference.py (prompt + both chats) has a top-1/top-2 logit
    # gap >= 0.025; changing PROMPT or the chats in reference.py voids that.
    return [
        # head_dim 16; llama3 scaling with head_dim 16 hits all three branches
        # (unscaled / smoothed / divided by factor) of the frequency remap.
        ("tiny-llama", LlamaForCausalLM, "legacy", 1033,
         LlamaConfig(**common(vocab, tok), intermediate_size=128, num_hidden_layers=3,
                     head_dim=16, tie_word_embeddings=False, rope_parameters=llama3)),
        # Qwen2: q/k/v bias (always on in Qwen2), tied embeddings.
        ("tiny-qwen2", Qwen2ForCausalLM, "native", 1040,
         Qwen2Config(**common(vocab, tok), intermediate_size=160, num_hidden_layers=2,
                     tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 20000.0})),
        # Qwen3: q_norm/k_norm, explicit head_dim 32 != hidden/heads (16), untied.
        ("tiny-qwen3", Qwen3ForCausalLM, "legacy", 1008,
         Qwen3Config(**common(vocab, tok), intermediate_size=128, num_hidden_layers=3,
                     head_dim=32, attention_bias=False, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
    ]


@torch.no_grad()
def randomize(model, seed):
    """Re-draw every parameter: norms ~ 1 + 0.1 N, biases ~ 0.2 N, embed/lm_head ~ EMB_STD N,
    other matrices ~ STD N."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # tied lm_head is not listed separately
        r = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if "norm" in name:                 # input/post_attention_layernorm, norm, q_norm, k_norm
            p.copy_(1.0 + 0.1 * r)
        elif name.endswith(".bias"):       # Qwen2 q/k/v biases
            p.copy_(0.2 * r)
        elif "embed_tokens" in name or "lm_head" in name:
            p.copy_(EMB_STD * r)
        else:
            p.copy_(STD * r)


def legacy_rope(path):
    """Rewrite rope_parameters as top-level rope_theta / rope_scaling (pre-v5 layout)."""
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, help="path to SmolLM2-135M-Instruct GGUF (tokenizer source)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    gdir, gname = os.path.split(os.path.abspath(a.gguf))
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    vocab = len(tok)  # 49152
    for name, cls, rope_fmt, seed, cfg in specs(vocab, tok):
        path = os.path.join(a.out, name)
        model = cls(cfg).to(torch.float32).eval()
        randomize(model, seed)
        model.save_pretrained(path, safe_serialization=True)
        if rope_fmt == "legacy":
            legacy_rope(path)
        # reloaded config must describe the same rope as the one we built
        got = AutoConfig.from_pretrained(path).rope_parameters
        assert got == cfg.rope_parameters, (name, got, cfg.rope_parameters)
        # chat template inline in tokenizer_config.json (no chat_template.jinja)
        tok.save_pretrained(path, save_jinja_files=False)
        print(f"wrote {path} ({sum(p.numel() for p in model.parameters())} params)")
    # Half-precision copies: the same folders with F16 / BF16 weights, to check that those
    # load (the reference then runs on exactly the rounded weights, upcast to float32).
    for src, dst, dtype in [("tiny-llama", "tiny-llama-f16", torch.float16),
                            ("tiny-qwen3", "tiny-qwen3-bf16", torch.bfloat16)]:
        sp, dp = os.path.join(a.out, src), os.path.join(a.out, dst)
        shutil.rmtree(dp, ignore_errors=True)
        shutil.copytree(sp, dp)
        w = load_file(os.path.join(sp, "model.safetensors"))
        save_file({k: v.to(dtype).contiguous() for k, v in w.items()},
                  os.path.join(dp, "model.safetensors"), metadata={"format": "pt"})
        print(f"wrote {dp} ({dtype})")


if __name__ == "__main__":
    main()
