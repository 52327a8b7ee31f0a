# P/D on one GPU across processes, measured in one run: a supervisor and two workers sharing the
# GPU serve the Qwen2.5-0.5B-shaped FP16 model (made by make_q05.py, which also times
# transformers on it) as an ordinary pair of replicas and as P/D with the pages moving
# GPU to GPU in one process, over CUDA IPC and over NIXL VRAM between the two workers.
# (also across KV layouts), and the ordinary pair once more without CUDA graphs. `xinf bench`
# runs on all of them side by side, then each route hands off 1,024-token prompts.
#
# Needs `xinf` (built with --features cuda) and tok/ (a tokenizer.json) next to this file,
# python3 with torch + transformers, and XINF_NIXL_LIB_DIR for the NIXL part. Usage:
#   OUT=/some/dir REQ=64 python3 pd_routes.py
import json, os, re, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
XINF = os.environ.get("XINF", os.path.join(HERE, "xinf"))
OUT = os.environ.get("OUT", "/tmp/pdr")
REQ = os.environ.get("REQ", "32")
W = "/tmp/pdr"
os.makedirs(W, exist_ok=True)
os.makedirs(OUT, exist_ok=True)
env = dict(os.environ, XINF_CLUSTER_SECRET="bench-secret", XINF_LOG="warn",
           LD_LIBRARY_PATH="/usr/local/cuda/lib64:" + os.environ.get("LD_LIBRARY_PATH", ""))
PORT = 18090
BASE = f"http://127.0.0.1:{PORT}"
nixl = bool(os.environ.get("XINF_NIXL_LIB_DIR"))

model = os.path.join(W, "model")
if not os.path.exists(os.path.join(model, "config.json")):
    subprocess.run([sys.executable, os.path.join(HERE, "make_q05.py"), model], check=True)


def spawn(args, log):
    return subprocess.Popen([XINF] + args, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env)


def wait_for(log, pattern, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, open(log).read())
        if m:
            return m
        time.sleep(0.2)
    sys.exit(f"no {pattern!r} in {log}:\n{open(log).read()}")


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


procs = [spawn(["supervisor", "--port", str(PORT), "--cluster-port", str(PORT + 1)], f"{W}/sup.log")]
wait_for(f"{W}/sup.log", r"REST API at")
workers = []
for i in (1, 2):
    log = f"{W}/w{i}.log"
    procs.append(spawn(["worker", "--supervisor", f"127.0.0.1:{PORT + 1}"], log))
    workers.append(wait_for(log, r"Worker (\S+)").group(1))
try:
    # Every replica shares GPU 0 of its worker (placement sets its device) with 10 % of its memory.
    gpu = {"gpu_memory_utilization": 0.1, "kv_cache_tokens": 65536}

    def rc(role, worker, layout):
        return {"role": role, "devices": [{"worker_ip": worker, "gpu_idx": [0]}], "engine_config": dict(gpu, **layout)}

    def launch(uid, replicas, transfer=None, engine_config=None):
        body = {"model_name": "qwen2.5-instruct", "model_uid": uid, "model_path": model,
                "model_format": "pytorch", "replica_config": replicas}
        if transfer:
            body["transfer_backend_type"] = transfer
        if engine_config:
            body["engine_config"] = engine_config
        call("POST", "/v1/models", body)

    w1, w2 = workers
    fa = {"kv_layout": "paged-kv-first", "block_size": 16}
    # Hybrid replicas take the model-wide engine_config (per-replica settings need P/D roles).
    on = lambda w: {"devices": [{"worker_ip": w, "gpu_idx": [0]}]}
    hnd = {"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16}
    models = {
        "ordinary": lambda: launch("ordinary", [on(w1), on(w2)], engine_config=dict(gpu, **fa)),
        # The same pair with decode steps launched kernel by kernel (no CUDA graphs), for comparison.
        "ordinary-eager": lambda: launch(
            "ordinary-eager", [on(w1), on(w2)], engine_config=dict(gpu, cuda_graphs=False, **fa)),
        "pd-local": lambda: launch("pd-local", [rc("prefill", w1, fa), rc("decode", w1, fa)]),
        "pd-ipc": lambda: launch("pd-ipc", [rc("prefill", w1, fa), rc("decode", w2, fa)]),
        # Across layouts: vLLM FlashAttention HND blocks of 16 → SGLang token pool, over CUDA IPC.
        "pd-ipc-x": lambda: launch(
            "pd-ipc-x", [rc("prefill", w1, hnd), rc("decode", w2, {"kv_layout": "token-pool"})]),
        "pd-nixl": lambda: launch("pd-nixl", [rc("prefill", w1, fa), rc("decode", w2, fa)], "nixl"),
    }
    if not nixl:
        del models["pd-nixl"]
    # ROUTES=pd-ipc,pd-nixl measures only those (BENCH=0: only their handoffs, no xinf bench).
    uids = [u for u in models if u in os.environ.get("ROUTES", ",".join(models)).split(",")]
    for uid in uids:
        models[uid]()
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout, flush=True)
    bench = [XINF, "bench", "-e", BASE] + sum((["-u", u] for u in uids), []) + [
        "--concurrency", "1,16", "--requests", REQ, "--prompt-tokens", "40,173,733,2833",
        "--output-tokens", "32", "--warmup", "2", "--json", f"{OUT}/bench.json"]
    if os.environ.get("BENCH", "1") != "0":
        r = subprocess.run(bench, capture_output=True, text=True, env=env, timeout=540)
        print(r.stdout[-6000:], r.stderr[-2000:], flush=True)
    # Handoff time of a 1,024-token prompt per route: the decode side's fetch (gather on the
    # prefill GPU, move, into the decode GPU's memory), from the stats' latency sums.
    for uid in [u for u in uids if u.startswith("pd-")]:
        xs = []
        for k in range(7):
            before = call("GET", f"/v1/models/{uid}/stats")["handoff"]["latency"]["sum_us"]
            ids = [100 + (i * 7 + k) % 30000 for i in range(1024)]
            call("POST", "/v1/completions", {"model": uid, "prompt": ids, "max_tokens": 1})
            xs.append(call("GET", f"/v1/models/{uid}/stats")["handoff"]["latency"]["sum_us"] - before)
        h = call("GET", f"/v1/models/{uid}/stats")["handoff"]
        keys = ["pages_transferred", "bytes_transferred", "gpu_bytes_transferred", "gpu_in_process_transfers",
                "cuda_ipc_transfers", "nixl_vram_transfers", "tcp_transfers", "in_process_transfers",
                "gpu_fallbacks", "failed"]
        print(f"{uid}: 1024-token handoff fetch us {sorted(xs)} median {sorted(xs)[3]}; "
              + ", ".join(f"{k} {h[k]}" for k in keys), flush=True)
finally:
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        p.wait()
    for name in ("sup", "w1", "w2"):
        text = open(f"{W}/{name}.log").read()
        bad = [l for l in text.splitlines() if "ERROR" in l or "panic" in l]
        if bad:
            print(name, "log:", *bad[:5], sep="\n  ")
