#!/usr/bin/env python3
"""P/D across engines through xinf's router, on one GPU: vLLM 0.26 replicas with xinf's KV
connector and SGLang 0.5.15 replicas with xinf's transfer backend (python/xinf_kv), and native
replicas, as prefill or decode of one model.

Opt-in (XINF_TEST_ENGINES=1; needs a GPU, a `--features cuda` xinf, vLLM and SGLang with
xinf_kv on VLLM_PYTHONPATH / SGLANG_PYTHONPATH). Starts `xinf local`, launches the models named
on the command line, each on GPU 0 with memory shares, and compares greedy completions
(token-id prompts of 64/65/66/128/129/130/193 tokens, streamed and not) of each P/D model with
the ordinary model of its prefill engine (an output that parts from it at a token where that
engine's ordinary server puts its top two log-probabilities within 0.02 passes as a tie):

  vo: ordinary vLLM      so: ordinary SGLang      no: ordinary native
  vv: vLLM P → vLLM D    vs: vLLM P → SGLang D    sv: SGLang P → vLLM D    ss: SGLang P → SGLang D
  nv: native P → vLLM D  vn: vLLM P → native D    ns: native P → SGLang D  sn: SGLang P → native D

It also sends 1-token prompts (a vLLM decode serves one after the prefill's shown first token
and refuses one clearly where nothing is shown early; xinf keeps answering), checks that no
decode engine's KV load failed (vLLM would recompute the prompt and hide it), and records each
model's replica counters.

usage: XINF_BIN=... MODEL=<HF folder> OUT=<dir> cross_pd.py vo so vs sv [...]
MEM sets every replica's share of the GPU's memory (default 0.12 for vLLM and SGLang, 0.08 for
the native engine); CANCEL=1 adds the cancellation checks; XINF_PORT uses a running xinf.
"""

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request

if os.environ.get("XINF_TEST_ENGINES") != "1":
    print("SKIPPED: set XINF_TEST_ENGINES=1 (needs a GPU, vLLM and xinf_kv)", file=sys.stderr)
    sys.exit(0)

XINF = os.environ["XINF_BIN"]
MODEL = os.environ["MODEL"]
OUT = os.environ.get("OUT", "/tmp/cross-pd")
# XINF_PORT names an `xinf local` already serving (its models of the same names are reused, not
# launched again); without it the script starts its own.
PORT = int(os.environ.get("XINF_PORT", "9397"))
EXISTING = "XINF_PORT" in os.environ
API = f"http://127.0.0.1:{PORT}"
os.makedirs(OUT, exist_ok=True)
results = []

# Each replica's share of the GPU's memory: MEM where set (all eight models fit at 0.06).
MEM = {e: float(os.environ.get("MEM", d)) for e, d in [("v", 0.12), ("s", 0.12), ("n", 0.08)]}
VLLM = {"model_engine": "vllm", "engine_config": {
    "env": {"PYTHONPATH": os.environ.get("VLLM_PYTHONPATH", ""), "VLLM_USE_FLASHINFER_SAMPLER": "0",
            "XINF_KV_LOG": "info"},
    "gpu_memory_utilization": MEM["v"], "enforce_eager": True, "context_length": 2048}}
SGLANG = {"model_engine": "sglang", "engine_config": {
    "env": {"PYTHONPATH": os.environ.get("SGLANG_PYTHONPATH", ""), "XINF_KV_LOG": "info"},
    "gpu_memory_utilization": MEM["s"], "context_length": 2048, "attention_backend": "triton",
    "sampling_backend": "pytorch", "disable_cuda_graph": True, "disable_radix_cache": True}}
NATIVE = {"model_engine": "native", "engine_config": {"gpu_memory_utilization": MEM["n"], "context_length": 2048}}
ENGINE = {"v": VLLM, "s": SGLANG, "n": NATIVE}
MODELS = {f"{e}o": [("hybrid", ENGINE[e])] for e in "vsn"}
MODELS.update({p + d: [("prefill", ENGINE[p]), ("decode", ENGINE[d])] for p in "vsn" for d in "vsn" if p + d != "nn"})
REFERENCE = {uid: uid[0] + "o" for uid in MODELS if uid[1] != "o"}


def check(name, ok, detail=""):
    results.append({"check": name, "ok": bool(ok), "detail": str(detail)[:600]})
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {str(detail)[:600]}"), flush=True)


def http(method, url, body=None, timeout=900):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:  # noqa: BLE001
        return 0, str(e).encode()


def launch(uid, spec, out):
    if EXISTING and http("GET", f"{API}/v1/models/{uid}")[0] == 200:
        out[uid] = ((200, b"already running"), 0.0)
        return
    replicas = []
    for role, eng in spec:
        # Local mode places every replica on its one worker, here on GPU 0 with memory shares.
        r = {"model_engine": eng["model_engine"], "engine_config": eng["engine_config"],
             "devices": [{"worker_ip": "127.0.0.1", "gpu_idx": [0]}]}
        if role != "hybrid":
            r["role"] = role
        replicas.append(r)
    body = {"model_uid": uid, "model_name": "tiny-qwen2", "model_path": MODEL,
            "model_engine": spec[0][1]["model_engine"], "replica_config": replicas}
    if len(spec) == 1:
        body = {"model_uid": uid, "model_name": "tiny-qwen2", "model_path": MODEL, "gpu_idx": [0], **spec[0][1]}
    t0 = time.time()
    out[uid] = (http("POST", f"{API}/v1/models", body), round(time.time() - t0, 1))


def complete(uid, ids, n, stream=False, stop=None, request_id=None):
    body = {"model": uid, "prompt": ids, "max_tokens": n, "temperature": 0, "stream": stream}
    if stop:
        body["stop"] = stop
    if request_id:
        body["request_id"] = request_id
    s, b = http("POST", f"{API}/v1/completions", body, timeout=120)
    if s != 200:
        return s, None, b
    return s, completion_text(b, stream), b


def choices_of(b, stream):
    """A completion answer's choices: the one of a whole answer, every chunk's of a stream."""
    if not stream:
        return [json.loads(b)["choices"][0]]
    return [c for line in b.decode().splitlines() if line.startswith("data: ") and line.strip() != "data: [DONE]"
            for c in json.loads(line[6:]).get("choices", [])]


def completion_text(b, stream):
    return "".join(c.get("text") or "" for c in choices_of(b, stream))


def engine_ports():
    """The ordinary (non-P/D) vLLM and SGLang servers xinf started, by engine: their ports, from
    their command lines, with the model name each serves."""
    import re
    import subprocess

    ports = {}
    for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines():
        if "--served-model-name" not in line or "kv-transfer-config" in line or "disaggregation-mode" in line:
            continue
        port = re.search(r"--port (\d+)", line)
        name = re.search(r"--served-model-name (\S+)", line)
        engine = "v" if "vllm.entrypoints" in line else "s" if "sglang.launch_server" in line else None
        if port and name and engine:
            ports.setdefault(engine, (int(port.group(1)), name.group(1)))
    return ports


def first_token_shown(engine, ids):
    """Whether the prefill `engine`'s greedy first token after `ids` is shown before the decode
    leg (its text whole: not empty, no piece of a character), as its ordinary server gives it;
    None when there is no such server to ask."""
    server = engine_ports().get(engine)
    if server is None:
        return None
    s, b = ordinary_completion(server, {"prompt": ids, "max_tokens": 1, "temperature": 0})
    if s != 200:
        return None
    text = json.loads(b)["choices"][0].get("text") or ""
    return bool(text) and "\ufffd" not in text


def ordinary_completion(server, body):
    """A completion straight from an ordinary server `(port, model name)`: (status, body)."""
    port, name = server
    return http("POST", f"http://127.0.0.1:{port}/v1/completions", {"model": name, **body}, timeout=120)


TIE = 0.02  # log-probability gap under which the top two tokens count as tied


def tie_where_they_part(engine, ids, n, got):
    """Whether `got` leaves the ordinary `engine` server's greedy output at a token where that
    server's top two log-probabilities are within TIE: a near-tie of this random-weight model
    that KV computed by the other engine may break the other way. Returns (bool, detail)."""
    # The native engine's ordinary replica is xinf's own `no`, whose API gives log-probabilities.
    server = (PORT, "no") if engine == "n" else engine_ports().get(engine)
    if server is None:
        return False, f"no ordinary {engine} server found to ask"
    s, b = ordinary_completion(server, {"prompt": ids, "max_tokens": n, "temperature": 0, "logprobs": 2})
    if s != 200:
        return False, f"the {engine} server answered {s}"
    lp = json.loads(b)["choices"][0].get("logprobs") or {}
    text = ""
    for i, (token, top) in enumerate(zip(lp.get("tokens") or [], lp.get("top_logprobs") or [])):
        if not got.startswith(text + token):
            values = sorted((top or {}).values(), reverse=True)
            gap = values[0] - values[1] if len(values) > 1 else None
            return gap is not None and gap <= TIE, f"token {i} {token!r}: top-2 gap {gap}"
        text += token
    return False, "no parting token found"


LOGPROB_TOLERANCE = 0.05  # the same first token scored by two engines' kernels


def scored(uid, ids, n, stream, stop=None):
    """A completion with `logprobs: 2`: (status, text, [(token, logprob, top ids)], body)."""
    body = {"model": uid, "prompt": ids, "max_tokens": n, "temperature": 0, "stream": stream, "logprobs": 2}
    if stop:
        body["stop"] = stop
    s, b = http("POST", f"{API}/v1/completions", body, timeout=120)
    if s != 200:
        return s, None, [], b
    text, entries = "", []
    for c in choices_of(b, stream):
        text += c.get("text") or ""
        lp = c.get("logprobs") or {}
        for token, value, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []):
            entries.append((token, value, sorted((top or {}).values(), reverse=True)))
    return s, text, entries, b


def logprob_checks(uid, ref, ids):
    """Log-probabilities through the handoff: every output token has its entry, and the first
    token's (the prefill engine's, which the decode side reports with it) is the ordinary
    replica's of that engine. With a stop string the first token is not shown early: then it
    comes from the decode engine's own stream (SGLang's from what xinf's backend wrote)."""
    s, want, want_lp, b = scored(ref, ids, 8, False)
    check(f"{ref}: log-probabilities of an ordinary completion", s == 200 and len(want_lp) > 0, b[:300])
    for stream in (False, True):
        for stop in (None, ["\u0001"]):
            how = f"{'stream' if stream else 'plain'}{' stop' if stop else ''}"
            s, text, got, b = scored(uid, ids, 8, stream, stop)
            ok = s == 200 and len(got) > 0 and "".join(t for t, _, _ in got) == text
            first_ok = ok and want_lp and abs(got[0][1] - want_lp[0][1]) <= LOGPROB_TOLERANCE and len(got[0][2]) >= 2
            check(f"{uid} logprobs {how}: an entry per token, the first as {ref}'s",
                  ok and first_ok, (s, got[:2], want_lp[:1], b[:300]))


CHOICES = ["yes please", "no thanks", "maybe later"]
REGEX = "(yes|no)-[0-9]{2}"


def structured_checks(uid, ids):
    """Structured output through the handoff: the prefill engine samples the first token under
    the grammar, and the decode engine goes on under it (SGLang feeds it the first token; vLLM,
    shown none early, samples the first itself). A choice must come out whole, a JSON schema as
    a document of it, streamed or not."""
    for stream in (False, True):
        how = "stream" if stream else "plain"
        body = {"model": uid, "prompt": ids, "max_tokens": 16, "temperature": 0, "stream": stream,
                "structured_outputs": {"choice": CHOICES}}
        s, b = http("POST", f"{API}/v1/completions", body, timeout=120)
        text = completion_text(b, stream) if s == 200 else None
        check(f"{uid} structured {how}: one of the choices", text in CHOICES, (s, text, b[:300]))
        body = {"model": uid, "prompt": ids, "max_tokens": 16, "temperature": 0, "stream": stream,
                "structured_outputs": {"regex": REGEX}}
        s, b = http("POST", f"{API}/v1/completions", body, timeout=120)
        text = completion_text(b, stream) if s == 200 else None
        check(f"{uid} structured {how}: a match of the regular expression",
              text is not None and re.fullmatch(REGEX, text) is not None, (s, text, b[:300]))


def prompt_logprob_checks(uid, ref, ids):
    """Prompt log-probabilities through the handoff: the prefill side computes the prompt, so
    its report is the prefill engine's, equal to its ordinary replica's."""
    def ask(model):
        body = {"model": model, "prompt": ids, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 2}
        s, b = http("POST", f"{API}/v1/completions", body, timeout=120)
        got = json.loads(b)["choices"][0].get("prompt_logprobs") if s == 200 else None
        return s, got, b
    s, want, b = ask(ref)
    check(f"{ref}: prompt log-probabilities of an ordinary completion", s == 200 and want, b[:300])
    s, got, b = ask(uid)
    same = s == 200 and want and got and len(got) == len(want) == len(ids) and got[0] is None and all(
        abs(g[str(t)]["logprob"] - w[str(t)]["logprob"]) <= 1e-3
        for g, w, t in zip(got[1:], want[1:], ids[1:]))
    check(f"{uid} prompt logprobs: {ref}'s, position by position", same, (s, b[:300]))


def stream_and_drop(uid, ids, request_id=None):
    """A streamed completion whose client goes away after the first chunk."""
    import http.client
    import socket

    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    body = {"model": uid, "prompt": ids, "max_tokens": 400, "temperature": 0, "stream": True}
    if request_id:
        body["request_id"] = request_id
    body = json.dumps(body)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    first = r.readline()  # the first line of the (chunked) body
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    return r.status, first


def cancellations(uid, vocab, rnd):
    """A disconnect and three aborts early in a request's life (before its prefill answers, as
    it does, just after): nothing may stay held — no running request, no room — and the model
    keeps answering."""
    s, first = stream_and_drop(uid, [rnd.randrange(100, vocab - 100) for _ in range(300)])
    check(f"{uid}: a streamed request whose client goes away starts", s == 200 and first.startswith(b"data:"), first[:200])
    for i, delay in enumerate((0.0, 0.02, 0.2)):
        rid = f"{uid}-cancel-{i}"
        body = {"model": uid, "prompt": [rnd.randrange(100, vocab - 100) for _ in range(700)], "max_tokens": 400,
                "temperature": 0, "stream": True, "request_id": rid}
        answer = []
        t = threading.Thread(target=lambda: answer.append(http("POST", f"{API}/v1/completions", body, 120)))
        t.start()
        time.sleep(delay)
        a, t0 = (0, b""), time.time()
        for _ in range(300):  # until the router knows the request
            a = http("POST", f"{API}/v1/models/{uid}/requests/{rid}/abort", {})
            if a[0] == 200 and b"DONE" in a[1]:
                break
            time.sleep(0.01)
        t.join(120)
        # An abort that overtakes its request (none runs yet: NOT_FOUND) blocks the id, and the
        # request that follows is refused as aborted (499), as Xinference's block_duration does.
        overtaken = a[0] == 200 and b"NOT_FOUND" in a[1] and answer and answer[0][0] == 499
        check(f"{uid}: abort {i} after {delay} s is acknowledged or refuses the request it overtook",
              a[0] == 200 and b"DONE" in a[1] or overtaken,
              (a, answer[0][:2] if answer else None, f"{time.time() - t0:.3f} s of tries"))
    held = None
    for _ in range(40):
        s, b = http("GET", f"{API}/v1/models/{uid}/stats")
        reps = json.loads(b).get("replicas", []) if s == 200 else []
        held = [(r["replica_uid"], r.get("running"), r.get("pinned_blocks")) for r in reps]
        if reps and all(r.get("running") == 0 and r.get("pinned_blocks") == 0 for r in reps):
            break
        time.sleep(0.25)
    check(f"{uid}: after them no request runs and no room or pinned block is held", held and all(h[1] == 0 and h[2] == 0 for h in held), held)
    s, _, b = complete(uid, [rnd.randrange(100, vocab - 100) for _ in range(70)], 4)
    check(f"{uid}: and the model keeps answering", s == 200, b[:300])


def retry_after_drop(uid, vocab, rnd):
    """A client that drops a streamed request after its first chunk and sends it again at once
    under the same request id is served in full: each attempt reaches its engine under an id of
    its own, so an engine still holding the first attempt's id does not refuse the second."""
    ids = [rnd.randrange(100, vocab - 100) for _ in range(300)]
    rid = f"{uid}-retry"
    s, first = stream_and_drop(uid, ids, rid)
    s2, text, b = complete(uid, ids, 8, request_id=rid)
    tokens = json.loads(b)["usage"]["completion_tokens"] if s2 == 200 else None
    check(f"{uid}: a request sent again under its id right after its client went away is served",
          s == 200 and s2 == 200 and tokens == 8, (s, first[:100], s2, b[:300]))


STARTED = time.time()
# vLLM's recovery, the vLLM connector's failed load, the SGLang backend's.
FAILED_LOAD = re.compile(r"KV load failure|xinf_kv: request \S+: KV load (?!done)|: loading KV: ")


def load_failures():
    """No decode engine recomputed a prompt because its KV load failed (the output would still
    be right: vLLM recovers by recomputing, which hides a handoff that moved nothing)."""
    logs = os.path.join(os.environ.get("XINF_HOME", os.path.expanduser("~/.xinf")), "logs")
    bad = []
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        path = os.path.join(logs, name)
        if os.path.getmtime(path) < STARTED:
            continue
        with open(path, errors="replace") as f:
            bad += [f"{name}: {line.strip()[:200]}" for line in f if FAILED_LOAD.search(line)]
    check("no decode engine's KV load failed", not bad, "; ".join(bad[:5]) + f" ({len(bad)} lines)")


def main():
    names = sys.argv[1:] or ["vo", "so", "vs", "sv"]
    log = open(os.path.join(OUT, "xinf.log"), "w")
    env = dict(os.environ, XINF_LOG="info,xinf_engine_external=debug", XINF_GPUS=os.environ.get("XINF_GPUS", "0"))
    xinf = None if EXISTING else subprocess.Popen(
        [XINF, "local", "--port", str(PORT)], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        for _ in range(120):
            if http("GET", f"{API}/v1/models", timeout=2)[0] == 200:
                break
            time.sleep(0.5)
        launched, threads = {}, []
        # A few launches at a time: engines that start together misjudge each other's memory.
        gate = threading.Semaphore(int(os.environ.get("LAUNCH_PARALLEL", "2")))

        def gated(uid):
            with gate:
                launch(uid, MODELS[uid], launched)

        for uid in names:
            t = threading.Thread(target=gated, args=(uid,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        for uid in names:
            (s, b), secs = launched[uid]
            check(f"{uid}: launch ({secs} s)", s == 200, b[:600])
        vocab = json.load(open(os.path.join(MODEL, "config.json")))["vocab_size"]
        rnd = random.Random(5)
        for n in [64, 65, 66, 128, 129, 130, 193]:
            ids = [rnd.randrange(100, vocab - 100) for _ in range(n)]
            want = {}
            for ref in sorted({"vo", "so", "no"} & set(names)):  # every ordinary model launched
                s, text, b = complete(ref, ids, 16)
                want[ref] = text if s == 200 else None
                check(f"{ref} {n}: ordinary completion", s == 200, b[:300])
            for uid in [u for u in names if u in REFERENCE and REFERENCE[u] in names]:
                ref = want.get(REFERENCE[uid])
                # Where the two engines' ordinary replicas disagree (near-ties of a random-weight
                # model), the decode engine computes every token after the first (vLLM's decode
                # the first too): the output then follows the decode engine's. The KV itself is
                # compared bit for bit by kv_bitwise.py.
                other = want.get(uid[1] + "o") if uid[1] != uid[0] else None
                for stream in (False, True):
                    s, text, b = complete(uid, ids, 16, stream)
                    if ref is not None and other is not None and ref != other and text == other:
                        check(f"{uid} {n} {'stream' if stream else 'plain'}: equals {uid[1]}o (the engines "
                              f"disagree here: {REFERENCE[uid]} {ref!r}, {uid[1]}o {other!r})", s == 200)
                        continue
                    if s == 200 and ref is not None and text is not None and text != ref:
                        tied, why = tie_where_they_part(uid[0], ids, 16, text)
                        if tied:
                            check(f"{uid} {n} {'stream' if stream else 'plain'}: equals {REFERENCE[uid]} up "
                                  f"to a tie ({why})", True)
                            continue
                    check(f"{uid} {n} {'stream' if stream else 'plain'}: equals {REFERENCE[uid]}",
                          s == 200 and ref is not None and text == ref, (s, text, ref, b[:300]))
        for uid in [u for u in names if u in REFERENCE and u[1] == "v"]:
            # The prefill's first token shown, vLLM's decode takes it as its prompt's last: a
            # 1-token prompt is served. With a stop string nothing is shown early, and vLLM's
            # decode, which recomputes the last prompt token, refuses it clearly.
            one = [rnd.randrange(100, vocab - 100)]
            s, text, b = complete(uid, one, 4)
            shown = first_token_shown(uid[0], one)
            if shown is False:
                # A first token whose text is not whole (a piece of a character) is not shown
                # early: the 1-token prompt then reaches vLLM's decode alone and is refused.
                check(f"{uid}: a vLLM decode refuses a 1-token prompt whose first token is not shown",
                      400 <= s < 500 and b"2 tokens" in b, (s, b[:300]))
            else:
                check(f"{uid}: a vLLM decode serves a 1-token prompt after the shown first token", s == 200,
                      (s, shown, b[:300]))
            s, text, b = complete(uid, one, 4, stop=["\u0001"])
            check(f"{uid}: with a stop string it refuses it clearly", 400 <= s < 500 and b"2 tokens" in b, (s, b[:300]))
            s, text, b = complete(uid, [rnd.randrange(100, vocab - 100) for _ in range(70)], 4)
            check(f"{uid}: and the model keeps answering", s == 200, (s, b[:300]))
        for uid in [u for u in names if u in REFERENCE and u[1] == "s"]:
            s, text, b = complete(uid, [rnd.randrange(100, vocab - 100)], 4)
            check(f"{uid}: an SGLang decode serves a 1-token prompt", s == 200, (s, b[:300]))
        for uid in [u for u in names if u in REFERENCE and REFERENCE[u] in names]:
            logprob_checks(uid, REFERENCE[uid], [rnd.randrange(100, vocab - 100) for _ in range(130)])
            structured_checks(uid, [rnd.randrange(100, vocab - 100) for _ in range(70)])
            prompt_logprob_checks(uid, REFERENCE[uid], [rnd.randrange(100, vocab - 100) for _ in range(65)])
        # Before the cancellations, whose aborts may end loads in flight.
        load_failures()
        if os.environ.get("CANCEL") == "1":
            for uid in [u for u in names if u in REFERENCE]:
                cancellations(uid, vocab, rnd)
            for uid in names:
                retry_after_drop(uid, vocab, rnd)
        s, b = http("GET", f"{API}/v1/models")
        open(os.path.join(OUT, "models.json"), "wb").write(b)
        for uid in names:
            s, b = http("GET", f"{API}/v1/models/{uid}")
            open(os.path.join(OUT, f"model-{uid}.json"), "wb").write(b)
    finally:
        if xinf is not None:
            os.killpg(xinf.pid, 15)
            try:
                xinf.wait(60)
            except Exception:  # noqa: BLE001
                os.killpg(xinf.pid, 9)
        json.dump(results, open(os.path.join(OUT, "results.json"), "w"), indent=1)
        fails = [r for r in results if not r["ok"]]
        # The failures again, last, where a log's tail shows them.
        for r in fails:
            print(f"FAILED {r['check']}: {r['detail']}", flush=True)
        print(f"{len(results) - len(fails)}/{len(results)} passed", flush=True)


main()
