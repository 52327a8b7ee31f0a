# Qwen2.5-0.5B-Instruct's published config, random FP16 weights (transformers init), plus the
# SmolLM2 tokenizer (ids < 49152 fit the 151936 vocabulary). Also times transformers' decode.
import json, os, shutil, sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
out = sys.argv[1]
cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=int(os.environ.get('VOCAB', '49152')), tie_word_embeddings=True,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).to(torch.float16)
model.save_pretrained(out, safe_serialization=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(os.path.join(os.path.dirname(__file__), "tok", f), out)
c = json.load(open(os.path.join(out, "config.json")))
c["xinf_random_weights"] = True
json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=1)
n = sum(p.numel() for p in model.parameters())
print(f"params {n} bytes {n*2}", flush=True)
# transformers on the GPU (FP16): generate() as users call it, and a bare decode loop
# (model forward with its KV cache, greedy argmax) that leaves out generate()'s overhead.
from transformers import DynamicCache
model = model.cuda().eval()
res = {}
for bs in (1, 16):
    ids = torch.randint(100, 40000, (bs, 128), device="cuda")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        t = []
        for new in (1, 129):
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
            t.append(time.perf_counter() - t0)
        gen_step = (t[1] - t[0]) / 128
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(8):
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(128):
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        loop_step = (time.perf_counter() - t0) / 128
    res[bs] = {"generate_step_ms": gen_step * 1e3, "loop_step_ms": loop_step * 1e3}
    print(f"transformers {__import__('transformers').__version__} torch {torch.__version__} bs={bs}: generate() step {gen_step*1e3:.2f} ms, bare decode loop step {loop_step*1e3:.2f} ms", flush=True)
json.dump(res, open(os.path.join(os.path.dirname(sys.argv[1]), "hf.json"), "w"))
