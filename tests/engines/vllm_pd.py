#!/usr/bin/env python3
"""vLLM 0.26 prefill → vLLM 0.26 decode through xinf's KV connector (xinf_kv.vllm_connector), on
one GPU, without xinf's router: this script plays the router's two legs.

Opt-in (XINF_TEST_ENGINES=1; needs a GPU, vLLM and xinf_kv built with `cuda` on PYTHONPATH).
It starts two vLLM servers on the same model with memory shares (P `kv_producer`, D
`kv_consumer` with `kv_load_failure_policy` recompute and prompt-token details), then for prompts
of 64/65/66/128/129/130/193 random token ids:

  - ordinary greedy output (P's server, no handoff fields) is the reference;
  - P leg: max_tokens 1 with {"xinf": {"room": R}} → the answer's kv_transfer_params name the room;
  - D leg: {"xinf": {"fetch": …}} → greedy output equals the reference, streaming and not, and
    usage.prompt_tokens_details.cached_tokens == N - 1 (the tokens loaded, vLLM recomputes the
    last); the connector's log shows the bytes moved GPU to GPU;
  - a room that was never published: the load fails, D recomputes, the output still equals the
    reference and both servers keep answering.

usage: MODEL=<HF folder> OUT=<dir> vllm_pd.py
"""

import json
import os
import random
import subprocess
import sys
import time
import urllib.request

if os.environ.get("XINF_TEST_ENGINES") != "1":
    print("SKIPPED: set XINF_TEST_ENGINES=1 (needs a GPU, vLLM and xinf_kv)", file=sys.stderr)
    sys.exit(0)

MODEL = os.environ["MODEL"]
OUT = os.environ.get("OUT", "/tmp/vllm-pd-out")
PY = os.environ.get("XINF_PYTHON", "python3")
os.makedirs(OUT, exist_ok=True)
results = []


def check(name, ok, detail=""):
    results.append({"check": name, "ok": bool(ok), "detail": str(detail)[:400]})
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {str(detail)[:400]}"), flush=True)


def post(port, path, body, timeout=120):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start(port, role, extra):
    cfg = {"kv_connector": "XinfConnector", "kv_connector_module_path": "xinf_kv.vllm_connector",
           "kv_role": role, **extra}
    cmd = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", "m",
           "--host", "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.25",
           "--max-model-len", "2048", "--enforce-eager", "--enable-prompt-tokens-details",
           "--kv-transfer-config", json.dumps(cfg)]
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0", XINF_KV_LOG="info")
    log = open(os.path.join(OUT, f"vllm-{role}.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(port, proc, deadline):
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(1)
    return False


def complete(port, ids, n, params=None, stream=False):
    body = {"model": "m", "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": stream}
    if params is not None:
        body["kv_transfer_params"] = params
    if stream:
        body["stream_options"] = {"include_usage": True}
    s, b = post(port, "/v1/completions", body)
    if s != 200:
        return s, None, None, b
    if not stream:
        j = json.loads(b)
        return s, j["choices"][0].get("token_ids"), j, b
    toks, last = [], None
    for line in b.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            j = json.loads(line[6:])
            for c in j.get("choices", []):
                toks.extend(c.get("token_ids") or [])
            last = j
    return s, toks, last, b


def main():
    vocab = json.load(open(os.path.join(MODEL, "config.json")))["vocab_size"]
    P, D = 8301, 8302
    t0 = time.time()
    p = start(P, "kv_producer", {})
    d = start(D, "kv_consumer", {"kv_load_failure_policy": "recompute"})
    try:
        up = wait_healthy(P, p, time.time() + 300) and wait_healthy(D, d, time.time() + 300)
        check("both vLLM servers start with the xinf connector", up, f"{time.time() - t0:.0f} s")
        if not up:
            return
        rnd = random.Random(3)
        x = {"endpoint": "{}", "device": None}
        for n in [64, 65, 66, 128, 129, 130, 193]:
            ids = [rnd.randrange(100, vocab - 100) for _ in range(n)]
            s, want, _, b = complete(P, ids, 16)
            if s != 200:
                check(f"{n}: ordinary completion", False, b)
                continue
            room = rnd.randrange(1, 1 << 62)
            s, first, pj, b = complete(P, ids, 1, {"xinf": {"room": room, "lease_ms": 60000}})
            kv = (pj or {}).get("kv_transfer_params") or {}
            check(f"{n}: the prefill names its room", s == 200 and kv.get("xinf", {}).get("room") == room, b[:300])
            if not kv.get("xinf"):
                continue
            check(f"{n}: the prefill's first token is the ordinary first token", first == want[:1], (first, want[:1]))
            x = kv["xinf"]
            fetch = {"xinf": {"fetch": {"room": room, "endpoint": x["endpoint"], "device": x["device"], "prompt_len": n}}}
            s, got, dj, b = complete(D, ids, 16, fetch)
            cached = ((dj or {}).get("usage") or {}).get("prompt_tokens_details") or {}
            check(f"{n}: decode output equals the ordinary greedy output", s == 200 and got == want, (got, want, b[:200]))
            check(f"{n}: the decode loaded N-1 prompt tokens", cached.get("cached_tokens") == n - 1, cached)
            s, got, dj, b = complete(D, ids, 16, fetch, stream=True)
            check(f"{n}: streamed decode output equals it too (the room serves twice)", s == 200 and got == want, (got, want))
        ids = [rnd.randrange(100, vocab - 100) for _ in range(130)]
        _, want, _, _ = complete(P, ids, 16)
        bogus = {"xinf": {"fetch": {"room": 12345, "endpoint": x["endpoint"], "device": x["device"], "prompt_len": 130}}}
        s, got, dj, b = complete(D, ids, 16, bogus)
        check("a room never published: the decode recomputes and answers the same", s == 200 and got == want, (s, got, want, b[:300]))
        s, _, _, b = complete(P, ids, 4)
        s2, _, _, b2 = complete(D, ids, 4)
        check("both servers keep answering", s == 200 and s2 == 200, (b[:200], b2[:200]))
        check("neither server died", p.poll() is None and d.poll() is None, (p.poll(), d.poll()))
    finally:
        for proc in (p, d):
            try:
                os.killpg(proc.pid, 15)
            except Exception:
                pass
        for proc in (p, d):
            try:
                proc.wait(30)
            except Exception:
                os.killpg(proc.pid, 9)
        json.dump(results, open(os.path.join(OUT, "results.json"), "w"), indent=1)
        fails = [r for r in results if not r["ok"]]
        print(f"{len(results) - len(fails)}/{len(results)} passed", flush=True)


main()
