#!/usr/bin/env python3
"""Ordinary vLLM and SGLang replicas behind xinf, against the same engine called directly.

Opt-in (XINF_TEST_ENGINES=1; skips loudly otherwise), on a GPU machine with vLLM 0.26 and
SGLang 0.5.15 installed for the interpreter in XINF_PYTHON (their sites on VLLM_PYTHONPATH and
SGLANG_PYTHONPATH). For each engine it starts `xinf local`, launches one replica with
model_engine spelled as Xinference spells it (vLLM, SGLang), and checks:
  - completions and chat, streamed and not, greedy: the same text and the same prompt token
    count through xinf as from the engine's own server (found from xinf's log);
  - a completion's log-probabilities (`logprobs: 3`): the same per-token values through xinf
    as from the engine's own server, three alternatives each, the chosen token's first;
  - `logit_bias` (+100 on one token): the same text through xinf as from the engine's own;
  - prompt log-probabilities (vLLM's `prompt_logprobs: 2`; `echo` with `logprobs: 1`): every
    prompt token's value through xinf as the engine's own server scores the prompt (vLLM's
    `prompt_logprobs`, SGLang's `input_token_logprobs`), the echoed lists the same values;
  - `response_format` (a JSON Schema of an integer): the output is an integer; vLLM's
    `structured_outputs.choice`: the output is one of the choices;
  - `tools` with a named function: the answer is that function's call, its arguments a
    document of the function's schema;
  - an engine server killed with SIGKILL: the replica is marked dead at once, requests fail
    with an error, and xinf keeps answering (vLLM);
  - terminate: the server's processes are gone (SGLang);
  - the engine's flag table equals the one xinf ships (scripts/engine-flags.py).
usage: XINF_BIN=... MODEL=<HF folder> OUT=<dir> ordinary_replicas.py [vllm] [sglang]
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

if os.environ.get("XINF_TEST_ENGINES") != "1":
    print("SKIPPED: set XINF_TEST_ENGINES=1 (needs a GPU, vLLM and SGLang)")
    sys.exit(0)

XINF = os.environ["XINF_BIN"]
MODEL = os.environ["MODEL"]
OUT = os.environ.get("OUT", "/tmp/engines-out")
PY = os.environ.get("XINF_PYTHON", "python3")
PORT = 9997
API = f"http://127.0.0.1:{PORT}"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.makedirs(OUT, exist_ok=True)
report = {"checks": [], "failures": []}


def check(name, ok, detail=""):
    report["checks"].append({"name": name, "ok": bool(ok), "detail": str(detail)[:2000]})
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        report["failures"].append(name)


def http(method, url, body=None, timeout=900):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url, body, timeout=900):
    status, text = http("POST", url, body, timeout)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, {"raw": text}


def stream_text(url, body):
    req = urllib.request.Request(url, data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for c in chunk.get("choices", []):
                text += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return text


def engine_pids(port):
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"--port" in cmd and str(port).encode() in cmd:
                pids.append(int(p))
    return pids


def group_pids(pgid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(p))
    return out


PROMPTS = [
    "the of and to in is you that it he was for on are as with his they at be this",
    " ".join(["have from or one had by word but not what all were we when your can said there"] * 4),
    " ".join(["use an each which she do how their if will up other about out many then them"] * 9),
]

ENGINES = {
    "vllm": {
        "model_engine": "vLLM",
        "engine_config": {
            "env": {"PYTHONPATH": os.environ.get("VLLM_PYTHONPATH", ""), "VLLM_USE_FLASHINFER_SAMPLER": "0"},
            "gpu_memory_utilization": 0.25, "enforce_eager": True, "enable_prefix_caching": False,
        },
    },
    "sglang": {
        "model_engine": "SGLang",
        "engine_config": {
            "env": {"PYTHONPATH": os.environ.get("SGLANG_PYTHONPATH", "")},
            "gpu_memory_utilization": 0.25, "attention_backend": "triton", "sampling_backend": "pytorch",
            "disable_cuda_graph": True, "disable_radix_cache": True,
        },
    },
}


def run_engine(name, log_path):
    spec = ENGINES[name]
    uid = f"{name}-tiny"
    t0 = time.time()
    status, body = post(f"{API}/v1/models", {
        "model_uid": uid, "model_name": "tiny-qwen2", "model_path": MODEL,
        "model_engine": spec["model_engine"], "engine_config": spec["engine_config"],
    })
    check(f"{name}: launch", status == 200, body)
    report[f"{name}_launch_s"] = round(time.time() - t0, 1)
    if status != 200:
        return
    plain = re.sub(r"\x1b\[[0-9;]*m", "", open(log_path).read())
    urls = re.findall(r"base_url=(http://127\.0\.0\.1:\d+)", plain)
    check(f"{name}: engine server found in xinf's log", urls, "no base_url")
    if not urls:
        return
    base = urls[-1]
    port = int(base.rsplit(":", 1)[1])
    served = json.loads(http("GET", f"{base}/v1/models")[1])["data"][0]["id"]
    for i, prompt in enumerate(PROMPTS):
        # Random weights may sample the end of sequence at once: ignore it, so 32 tokens compare.
        req = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
        sd, d = post(f"{base}/v1/completions", dict(req, model=served))
        xs = stream_text(f"{API}/v1/completions", dict(req, model=uid))
        tx, td = x.get("choices", [{}])[0].get("text"), d.get("choices", [{}])[0].get("text")
        # Random weights may only sample special tokens (no text): equal still, but say so.
        check(f"{name}: completion {i} equals the engine's own", sx == sd == 200 and tx == td,
              f"xinf {sx} {tx!r} engine {sd} {td!r}")
        report.setdefault(f"{name}_nonempty_equal", 0)
        report[f"{name}_nonempty_equal"] += int(bool(tx) and tx == td)
        check(f"{name}: completion {i} streamed equals non-streamed", xs == tx, f"{xs!r} vs {tx!r}")
        px, pd = x.get("usage", {}).get("prompt_tokens"), d.get("usage", {}).get("prompt_tokens")
        check(f"{name}: completion {i} prompt tokens (xinf tokenizes as the engine does)", px == pd and px,
              f"{px} vs {pd}")
        chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "temperature": 0,
                "ignore_eos": True}
        sx, x = post(f"{API}/v1/chat/completions", dict(chat, model=uid))
        sd, d = post(f"{base}/v1/chat/completions", dict(chat, model=served))
        cx = x.get("choices", [{}])[0].get("message", {}).get("content")
        cd = d.get("choices", [{}])[0].get("message", {}).get("content")
        check(f"{name}: chat {i} equals the engine's own", sx == sd == 200 and cx == cd, f"{cx!r} vs {cd!r}")
        report[f"{name}_nonempty_equal"] += int(bool(cx) and cx == cd)
        xs = stream_text(f"{API}/v1/chat/completions", dict(chat, model=uid))
        check(f"{name}: chat {i} streamed equals non-streamed", xs == cx, f"{xs!r} vs {cx!r}")
    report[f"{name}_sample"] = tx
    # Log-probabilities: xinf asks the engine in its own shape and reports OpenAI's.
    req = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 3}
    sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
    sd, d = post(f"{base}/v1/completions", dict(req, model=served))
    lx = (x.get("choices") or [{}])[0].get("logprobs") or {}
    ld = (d.get("choices") or [{}])[0].get("logprobs") or {}
    vx, vd = lx.get("token_logprobs") or [], ld.get("token_logprobs") or []
    close = len(vx) == len(vd) == 8 and all(abs(a - b) <= 1e-3 for a, b in zip(vx, vd))
    check(f"{name}: log-probabilities equal the engine's own", sx == sd == 200 and close, f"{vx} vs {vd}")
    tops = lx.get("top_logprobs") or []
    firsts = [max(t.values()) if t else None for t in tops]
    check(f"{name}: three alternatives per token, the greedy token the likeliest",
          len(tops) == 8 and all(len(t) == 3 for t in tops) and firsts == vx, tops)
    # logit_bias: xinf passes it on in the engine's own shape.
    req = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "logit_bias": {"100": 100}}
    sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
    sd, d = post(f"{base}/v1/completions", dict(req, model=served))
    tx, td = (x.get("choices") or [{}])[0].get("text"), (d.get("choices") or [{}])[0].get("text")
    check(f"{name}: logit_bias gives the engine's own text", sx == sd == 200 and tx == td, f"{tx!r} vs {td!r}")
    check_prompt_logprobs(name, uid, base, served)
    # response_format: the engine's own grammar (xgrammar) keeps the random model's output an
    # integer.
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    req = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "response_format": fmt}
    sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
    tx = (x.get("choices") or [{}])[0].get("text") or ""
    try:
        shaped = isinstance(json.loads(tx), int)
    except ValueError:  # json.JSONDecodeError included
        shaped = False
    check(f"{name}: response_format json_schema is followed", sx == 200 and shaped, (sx, tx, x))
    report[f"{name}_structured"] = tx
    # vLLM's structured_outputs.choice (a regular expression of the choices for SGLang).
    options = ["alpha", "beta.gamma", "x|y"]
    req = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "structured_outputs": {"choice": options}}
    sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
    tx = (x.get("choices") or [{}])[0].get("text")
    check(f"{name}: structured_outputs choice is followed", sx == 200 and tx in options, (sx, tx, x))
    # tools with a named function: xinf writes the tools into the prompt ids and sends the
    # function's parameters as the engine's JSON Schema; the answer is that function's call.
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"], "additionalProperties": False}}}
    req = {"messages": [{"role": "user", "content": "Pick a digit."}], "max_tokens": 60, "temperature": 0,
           "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "pick"}}}
    sx, x = post(f"{API}/v1/chat/completions", dict(req, model=uid))
    choice = (x.get("choices") or [{}])[0]
    calls = (choice.get("message") or {}).get("tool_calls") or [{}]
    fn = calls[0].get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "") if choice.get("finish_reason") == "stop" else {"n": 0}
    except ValueError:
        args = None
    called = sx == 200 and fn.get("name") == "pick" and isinstance(args, dict) and isinstance(args.get("n"), int)
    check(f"{name}: a named tool is called with arguments of its schema", called, (sx, x))
    pids = engine_pids(port)
    pgid = os.getpgid(pids[0]) if pids else -1
    report[f"{name}_group_size"] = len(group_pids(pgid))
    if name == "vllm":
        # A crash of the server itself (not of its group): xinf must clean up the rest.
        os.kill(pgid, signal.SIGKILL)
        t1 = time.time()
        dead = False
        while time.time() - t1 < 15:
            s, b = http("GET", f"{API}/v1/models/{uid}")
            if "dead" in b.lower() or s != 200 or '"ready"' not in b:
                dead = True
                break
            time.sleep(0.2)
        report["vllm_dead_seen_s"] = round(time.time() - t1, 2)
        report["vllm_dead_status"] = b[:500]
        check("vllm: a killed server marks its replica dead", dead, b)
        s, b = post(f"{API}/v1/completions", {"model": uid, "prompt": "the", "max_tokens": 4}, timeout=30)
        check("vllm: a request to the dead replica fails with an error", s >= 400 and "error" in json.dumps(b), (s, b))
        s, _ = http("GET", f"{API}/v1/models")
        check("vllm: xinf keeps answering", s == 200, s)
        time.sleep(1)
        check("vllm: the dead server's other processes are gone", not group_pids(pgid), group_pids(pgid))
        http("DELETE", f"{API}/v1/models/{uid}")
    else:
        t1 = time.time()
        s, b = http("DELETE", f"{API}/v1/models/{uid}")
        report[f"{name}_terminate_s"] = round(time.time() - t1, 2)
        check(f"{name}: terminate", s == 200, b)
        time.sleep(1)
        left = group_pids(pgid)
        check(f"{name}: terminate stops every process of the server", pgid > 0 and not left, (pgid, left))


def check_prompt_logprobs(name, uid, base, served):
    """Every prompt token's log-probability through xinf against the engine's own scoring."""
    req = {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    sx, x = post(f"{API}/v1/completions", dict(req, model=uid))
    listed = (x.get("choices") or [{}])[0].get("prompt_logprobs") or []
    # The prompt's own token at each position: the entry whose rank is not among the top 2, or
    # the one the echoed list names (below); kept by id here.
    se, e = post(f"{API}/v1/completions", {"model": uid, "prompt": PROMPTS[0], "max_tokens": 1,
                                          "temperature": 0, "logprobs": 1, "echo": True})
    echoed = ((e.get("choices") or [{}])[0].get("logprobs") or {}).get("token_logprobs") or []
    n = (x.get("usage") or {}).get("prompt_tokens") or 0
    if name == "vllm":
        sd, d = post(f"{base}/v1/completions", dict(req, model=served))
        own = [None] + [None] * (n - 1)
        for i, pos in enumerate((d.get("choices") or [{}])[0].get("prompt_logprobs") or []):
            if pos and i < n:
                # vLLM lists the prompt's token first.
                own[i] = float(next(iter(pos.values()))["logprob"])
    else:
        sd, d = post(f"{base}/generate", {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 1},
                                         "return_logprob": True, "logprob_start_len": 0})
        own = [t[0] for t in (d.get("meta_info") or {}).get("input_token_logprobs") or []]
    mine = [None] + [None] * (n - 1)
    for i, pos in enumerate(listed):
        if pos:
            mine[i] = float(next(iter(pos.values()))["logprob"])
    close = lambda a, b: a is None and b is None or (a is not None and b is not None and abs(a - b) <= 1e-3)
    same = n > 1 and len(own) == n and all(close(a, b) for a, b in zip(mine, own))
    check(f"{name}: prompt log-probabilities equal the engine's own", sx == sd == 200 and same, (mine, own))
    check(f"{name}: the echoed prompt carries the same values", se == 200 and len(echoed) == n + 1
          and all(close(a, b) for a, b in zip(echoed[:n], mine)), (echoed, mine))


def xinf_killed(xinf):
    """xinf itself killed with SIGKILL: the engine server it started goes too (parent-death
    signal), so a GPU is never held by an orphan."""
    spec = ENGINES["vllm"]
    status, body = post(f"{API}/v1/models", {
        "model_uid": "orphan", "model_name": "tiny-qwen2", "model_path": MODEL,
        "model_engine": "vllm", "engine_config": spec["engine_config"],
    })
    check("xinf killed: launch", status == 200, body)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", open(os.path.join(OUT, "xinf.log")).read())
    port = int(re.findall(r"base_url=http://127\.0\.0\.1:(\d+)", plain)[-1])
    pids = engine_pids(port)
    pgid = os.getpgid(pids[0])
    os.killpg(xinf.pid, signal.SIGKILL)
    t0 = time.time()
    while time.time() - t0 < 30 and group_pids(pgid):
        time.sleep(0.2)
    report["orphan_gone_s"] = round(time.time() - t0, 2)
    left = group_pids(pgid)
    report["orphans"] = [open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ")[:200].decode()
                         for p in left if os.path.exists(f"/proc/{p}/cmdline")]
    check("xinf killed: its engine server's processes are gone", not left, left)
    for pid in left:
        os.kill(pid, signal.SIGKILL)


def flag_tables(name):
    env = dict(os.environ, PYTHONPATH=ENGINES[name]["engine_config"]["env"]["PYTHONPATH"])
    r = subprocess.run([PY, os.path.join(REPO, "scripts/engine-flags.py"), name], env=env,
                       capture_output=True, text=True, timeout=300)
    got = {l for l in r.stdout.splitlines() if l.startswith("--")}
    table = {"vllm": "vllm-0.26.0.txt", "sglang": "sglang-0.5.15.txt"}[name]
    shipped = {l for l in open(os.path.join(REPO, "engines/external/src/flags", table)).read().splitlines()
               if l.startswith("--")}
    open(os.path.join(OUT, f"flags-{name}.txt"), "w").write(r.stdout + r.stderr[-3000:])
    check(f"{name}: shipped flag table equals the engine's parser", got == shipped,
          f"missing {sorted(got - shipped)[:20]} extra {sorted(shipped - got)[:20]} rc={r.returncode}")


def main():
    names = sys.argv[1:] or ["vllm", "sglang"]
    log_path = os.path.join(OUT, "xinf.log")
    env = dict(os.environ, XINF_LOG="info,xinf_engine_external=debug")
    xinf = subprocess.Popen([XINF, "local", "--port", str(PORT)], stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        for _ in range(100):
            try:
                if http("GET", f"{API}/v1/models", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        for name in names:
            try:
                flag_tables(name)
            except Exception as e:  # noqa: BLE001
                check(f"{name}: flag table", False, repr(e))
            try:
                run_engine(name, log_path)
            except Exception as e:  # noqa: BLE001
                check(f"{name}: run", False, repr(e))
        if "vllm" in names:
            try:
                xinf_killed(xinf)
            except Exception as e:  # noqa: BLE001
                check("xinf killed", False, repr(e))
    finally:
        try:
            os.killpg(xinf.pid, signal.SIGTERM)
            xinf.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(xinf.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        json.dump(report, open(os.path.join(OUT, "report.json"), "w"), indent=1)
    print(f"{len(report['checks']) - len(report['failures'])}/{len(report['checks'])} checks passed")
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
