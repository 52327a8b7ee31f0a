#!/usr/bin/env python3
"""Write a random-weight Qwen2 (or Llama) Hugging Face folder with a locally trained tokenizer,
for the engine tests and benchmarks where no model hub can be reached.

Needs only torch, transformers and tokenizers. The defaults are a tiny 4-layer model;
`--qwen05` gives Qwen2.5-0.5B-Instruct's published shape (24 layers, hidden 896, 14 heads,
2 KV heads, intermediate 4864, tied embeddings) with the tokenizer's vocabulary (`--vocab 151936`
for the published one); `--llama8b` gives Llama-3.1-8B's (32 layers, hidden 4096, 32 heads,
8 KV heads, intermediate 14336, vocabulary 128256, RoPE base 500000).
usage: python3 make_model.py OUT_DIR [--arch qwen2|llama] [--layers 4] [--hidden 512] [--qwen05]
       [--llama8b] [--device cuda]
"""
import argparse
import json
import os

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--hidden", type=int, default=512)
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--kv-heads", type=int, default=2)
ap.add_argument("--vocab", type=int, default=4096)
ap.add_argument("--intermediate", type=int, default=0, help="default: 3 × hidden")
ap.add_argument("--qwen05", action="store_true", help="Qwen2.5-0.5B-Instruct's shape")
ap.add_argument("--llama8b", action="store_true", help="Llama-3.1-8B's shape")
ap.add_argument("--seed", type=int, default=0)
# An 8B model's random initialisation takes minutes on a CPU and seconds on a GPU. The weights
# differ between the two (each has its own generator), so a folder's tests must use one.
ap.add_argument("--device", default="cpu", help="where the weights are drawn (cpu or cuda)")
a = ap.parse_args()
rope_theta = 10000.0
if a.qwen05:
    a.arch, a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate = "qwen2", 24, 896, 14, 2, 4864
    a.vocab = max(a.vocab, 32768)
if a.llama8b:
    a.arch, a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate = "llama", 32, 4096, 32, 8, 14336
    a.vocab, rope_theta = 128256, 500000.0
os.makedirs(a.out, exist_ok=True)

# Byte-level BPE trained on a synthetic corpus: every byte is representable.
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
trainer = trainers.BpeTrainer(vocab_size=a.vocab - 8, special_tokens=specials,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
# Common English, including every word `xinf bench` writes its prompts with (so that they count
# about one token per word, as with a real tokenizer), capitalised too.
words = ("the of and to in is you that it he was for on are as with his they at be this "
         "have from or one had by word but not what all were we when your can said there "
         "use an each which she do how their if will up other about out many then them "
         "her has been more would who so no time people water river mountain city garden morning "
         "evening story number music window light house road winter summer market letter question "
         "answer small large quiet bright early late old new green blue walks reads builds finds "
         "carries opens watches remembers slowly often together always never again under between "
         "across behind request").split()
corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(2000)]
corpus += [" ".join(w.capitalize() + "." for w in words), " ".join(f"{n:06d}." for n in range(2000))]
tok.train_from_iterator(corpus, trainer)
# Every id the model can emit decodes to text: the trained vocabulary is much smaller than the
# model's, so the rest are plain added tokens (` w123`). An id without a token would decode to
# nothing, and a benchmark's streams would carry no text.
missing = a.vocab - tok.get_vocab_size()
tok.add_tokens([AddedToken(f" w{i}", normalized=False, special=False) for i in range(max(missing, 0))])
assert tok.get_vocab_size() == a.vocab, (tok.get_vocab_size(), a.vocab)
tok.save(os.path.join(a.out, "tokenizer.json"))
eos = "<|endoftext|>"
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos,
           "bos_token": None, "model_max_length": 32768,
           "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
          open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=1)
json.dump({"eos_token": eos, "pad_token": eos},
          open(os.path.join(a.out, "special_tokens_map.json"), "w"))

from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config  # noqa: E402

Cfg = Qwen2Config if a.arch == "qwen2" else LlamaConfig
cfg = Cfg(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate or a.hidden * 3,
          num_hidden_layers=a.layers, num_attention_heads=a.heads,
          num_key_value_heads=a.kv_heads, max_position_embeddings=4096,
          eos_token_id=tok.token_to_id(eos), bos_token_id=tok.token_to_id(eos),
          tie_word_embeddings=a.qwen05, rope_theta=rope_theta, torch_dtype="float16")
torch.manual_seed(a.seed)
with torch.device(a.device):
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float16)
model.save_pretrained(a.out, safe_serialization=True)
json.dump({"eos_token_id": cfg.eos_token_id, "bos_token_id": cfg.bos_token_id},
          open(os.path.join(a.out, "generation_config.json"), "w"))
print("wrote", a.out, "head_dim", a.hidden // a.heads, "layers", a.layers,
      "kv_heads", a.kv_heads, "vocab", a.vocab)
