#!/usr/bin/env python3
"""Reference outputs from Hugging Face transformers (CPU, float32) for xinf golden tests.

usage: reference.py --model DIR [--gguf-file NAME] --out OUT.json
  DIR is a HF safetensors folder, or (with --gguf-file) the folder holding NAME.

Output JSON:
  prompt_text, prompt_ids      fixed >=100-token paragraph; tokenizer(text) ids (HF defaults)
  last_logits                  float32 logits at the last prompt position (full vocab)
  greedy_ids                   32 greedy tokens after the prompt (argmax, no EOS stop)
  greedy_margins               top1-top2 logit gap at each of those 32 steps (near-tie hint)
  greedy_logprobs              at each of those steps, the log-softmax (float64) of the logits:
                               {"chosen": logprob of the greedy token, "top": [[id, logprob]]
                               of the 5 most likely}
  prompt_logprobs              for each prompt token after the first, the log-softmax (float64)
                               at the position before it: {"chosen": the token's, "rank": 1 +
                               how many are larger, "ties": how many others are within 1e-3 of
                               it, "top": [[id, logprob]] of the 5 most likely}
  chat / chat_no_system        chat_text, chat_ids, chat_greedy_ids (<=24 tokens, stops at
                               eos, eos included if produced), chat_greedy_text
                               (skip_special_tokens), chat_greedy_margins
  config                       dtype, vocab_size, model_type, eos/bos ids, add_bos
Greedy decoding is a manual argmax loop over the KV cache: exact and simple.
"""
import argparse
import inspect
import json
import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the network

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = (
    "Paris began as a small settlement of the Parisii, a Celtic tribe that lived on an island "
    "in the Seine around the third century before Christ. The Romans conquered the area in 52 BC "
    "and built a town called Lutetia, with baths, a forum and an amphitheatre on the left bank. "
    "In the Middle Ages the city grew into one of the largest in Europe: the cathedral of Notre-Dame "
    "was begun in 1163, the university drew scholars from every kingdom, and the kings of France "
    "made the Louvre their fortress. The Revolution of 1789 began with the storming of the Bastille, "
    "and in the nineteenth century Baron Haussmann rebuilt the centre with wide boulevards, parks "
    "and sewers. Today the city"
)
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}


def floats(t):
    return [float(x) for x in t.to(torch.float32).tolist()]


@torch.no_grad()
def greedy(model, ids, n, eos=None):
    """Argmax decode n tokens with the KV cache; stop after eos if given.

    Returns (ids, margins, logprobs): logprobs as described for greedy_logprobs."""
    # transformers >= 5.x renamed the cache argument/output past_key_values -> cache
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out, margins, logprobs, past = [], [], [], None
    x = torch.tensor([ids])
    for _ in range(n):
        r = model(input_ids=x, use_cache=True, **{kw: past})
        past, logits = getattr(r, kw), r.logits[0, -1].float()
        top = torch.topk(logits, 2)
        tok = int(top.indices[0])
        out.append(tok)
        margins.append(float(top.values[0] - top.values[1]))
        lp = torch.log_softmax(logits.double(), -1)
        top5 = torch.topk(lp, 5)
        logprobs.append({"chosen": float(lp[tok]),
                         "top": [[int(i), float(v)] for v, i in zip(top5.values, top5.indices)]})
        if eos is not None and tok == eos:
            break
        x = torch.tensor([[tok]])
    return out, margins, logprobs


def chat(model, tok, messages, n=24):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    ids = [int(i) for i in ids]
    # the template text already carries special tokens; re-tokenizing it must agree
    assert ids == tok(text, add_special_tokens=False)["input_ids"], "chat ids != tokenize(chat_text)"
    gen, margins, _ = greedy(model, ids, n, eos=tok.eos_token_id)
    return {"chat_text": text, "chat_ids": ids, "chat_greedy_ids": gen,
            "chat_greedy_text": tok.decode(gen, skip_special_tokens=True),
            "chat_greedy_margins": margins}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf-file", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    t0 = time.time()
    kw = {"gguf_file": a.gguf_file} if a.gguf_file else {}
    tok = AutoTokenizer.from_pretrained(a.model, **kw)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, **kw).eval()

    prompt_ids = [int(i) for i in tok(PROMPT)["input_ids"]]
    assert len(prompt_ids) >= 100, len(prompt_ids)
    with torch.no_grad():
        all_logits = model(input_ids=torch.tensor([prompt_ids])).logits[0]
    last_logits = all_logits[-1]
    prompt_logprobs = []
    for j, row in enumerate(torch.log_softmax(all_logits[:-1].double(), -1), start=1):
        chosen = row[prompt_ids[j]]
        top5 = torch.topk(row, 5)
        prompt_logprobs.append({"chosen": float(chosen), "rank": int((row > chosen).sum()) + 1,
                                "ties": int(((row - chosen).abs() <= 1e-3).sum()) - 1,
                                "top": [[int(i), float(v)] for v, i in zip(top5.values, top5.indices)]})
    greedy_ids, greedy_margins, greedy_logprobs = greedy(model, prompt_ids, 32)

    res = {
        "model": os.path.basename(os.path.normpath(a.model)) + (f"/{a.gguf_file}" if a.gguf_file else ""),
        "prompt_text": PROMPT,
        "prompt_ids": prompt_ids,
        "last_logits": floats(last_logits),
        "greedy_ids": greedy_ids,
        "greedy_text": tok.decode(greedy_ids),
        "greedy_margins": greedy_margins,
        "greedy_logprobs": greedy_logprobs,
        "prompt_logprobs": prompt_logprobs,
        "chat": chat(model, tok, [SYSTEM, USER]),
        "chat_no_system": chat(model, tok, [USER]),
        "config": {
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "vocab_size": int(model.config.vocab_size),
            "logits_len": int(last_logits.shape[0]),
            "model_type": model.config.model_type,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            # does tokenizer(text) prepend BOS?
            "add_bos": bool(prompt_ids[0] == tok.bos_token_id),
            "transformers_version": __import__("transformers").__version__,
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f)
    gm = torch.tensor(greedy_margins)
    print(f"{res['model']}: {len(prompt_ids)} prompt tokens, greedy margin min {gm.min():.4g} "
          f"median {gm.median():.4g}, chat: {res['chat']['chat_greedy_text']!r} "
          f"({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
