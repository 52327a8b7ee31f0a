"""Time one-token requests sent straight to the engine servers of a running `xinf local`, without
xinf in the path: each ordinary or prefill-mode vLLM and SGLang server, streamed and not, so
that a P/D pair's prefill leg can be told apart from the engine's own first token.

xinf's debug log times a prefill leg from xinf to the answer (`pd-engines.md`): on the H200
SGLang's prefill-mode leg took 6–8 ms more than its ordinary server's first token. This asks
each server the same way:

- an ordinary server: `max_tokens` 1, streamed (time to the first event) and not (time to the
  answer);
- a prefill-mode server: the same with xinf's handoff fields (a room published with a short
  lease and never fetched; the lease frees it), as xinf's prefill leg sends them.

The servers are found by their logs under `$XINF_HOME/logs` (`vllm-<model>-<port>.log`,
`sglang-<model>-<port>.log`; the mode is read from the log). Prompts are random ids of
`--len` tokens, a new prompt per request.

    python3 engine_legs.py [--len 733] [--n 30] [--shape LAYERS,KV_HEADS,HEAD_DIM,ELEM_BYTES]

`--shape` is the model's KV shape, which an SGLang prefill ticket carries (default: the
Qwen2.5-0.5B shape of `make_model.py --qwen05`, 24,2,64,2). Needs `xinf_kv` importable (the
SGLang tickets); standard library otherwise.
"""

import argparse
import glob
import http.client
import json
import os
import random
import re
import statistics
import time

from xinf_kv.params import make_ticket


def servers(logs):
    """(flavor, mode, port) of every engine server with a log in `logs`."""
    found = []
    for path in sorted(glob.glob(os.path.join(logs, "*.log"))):
        m = re.match(r"(vllm|sglang)-.*-(\d+)\.log$", os.path.basename(path))
        if not m:
            continue
        text = open(path, errors="replace").read(2_000_000)
        if m.group(1) == "sglang":
            mode = re.search(r"disaggregation_mode='(\w+)'", text)
            mode = mode.group(1) if mode else "null"
        else:
            mode = re.search(r"kv_role['\"]?\s*[:=]\s*['\"]?(kv_\w+)", text)
            mode = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(mode.group(1) if mode else "", "null")
        found.append((m.group(1), mode, int(m.group(2))))
    return found


def call(port, path, body, stream):
    """Milliseconds to the first event (streamed) or to the whole answer, and the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = json.dumps(body).encode()
    start = time.perf_counter()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if stream:
        while True:
            line = r.readline()
            if not line or line.startswith(b"data:"):
                break
        ms = (time.perf_counter() - start) * 1e3
        r.read()
    else:
        r.read()
        ms = (time.perf_counter() - start) * 1e3
    conn.close()
    return ms, r.status


def alive(port):
    """Whether a server answers on `port` (a log may be left by one that stopped)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def served_name(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())
    return models["data"][0]["id"]


def body(flavor, mode, ids, stream, shape, name):
    if flavor == "sglang":
        b = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "stream": stream}
        if mode == "prefill":
            layers, heads, dim, elem = shape
            ticket = make_ticket({"lease_ms": 2000, "shape": {"layers": layers, "kv_heads": heads, "head_dim": dim, "elem_bytes": elem}})
            b.update(bootstrap_host=ticket, bootstrap_port=0, bootstrap_room=random.randrange(1, 1 << 62))
        return "/generate", b
    b = {"model": name, "prompt": ids, "max_tokens": 1, "temperature": 0, "stream": stream}
    if mode == "prefill":
        b["kv_transfer_params"] = {"xinf": {"room": random.randrange(1, 1 << 62), "lease_ms": 2000}}
    return "/v1/completions", b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--len", type=int, default=733, help="prompt tokens")
    ap.add_argument("--n", type=int, default=30, help="requests per server and way (after 3 warm-ups)")
    ap.add_argument("--vocab", type=int, default=32768, help="ids are drawn below this")
    ap.add_argument("--shape", default="24,2,64,2", help="layers,kv_heads,head_dim,elem_bytes")
    ap.add_argument("--logs", default=os.path.join(os.environ.get("XINF_HOME", os.path.expanduser("~/.xinf")), "logs"))
    a = ap.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    rows = []
    for flavor, mode, port in servers(a.logs):
        if mode == "decode":
            continue
        if not alive(port):
            continue
        name = served_name(port) if flavor == "vllm" else None
        for stream in (True, False):
            times, bad = [], 0
            for i in range(a.n + 3):
                ids = [random.randrange(100, a.vocab) for _ in range(a.len)]
                path, b = body(flavor, mode, ids, stream, shape, name)
                ms, status = call(port, path, b, stream)
                if status != 200:
                    bad += 1
                elif i >= 3:
                    times.append(ms)
            way = "streamed, first event" if stream else "not streamed, answer"
            p50 = f"{statistics.median(times):.1f}" if times else "–"
            low = f"{min(times):.1f}" if times else "–"
            rows.append(f"| {flavor} | {mode} | {port} | {way} | {p50} | {low} | {bad} |")
    print(f"One-token requests of {a.len} random ids straight to each engine server, {a.n} each:")
    print("| engine | mode | port | request | p50 ms | min ms | errors |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
