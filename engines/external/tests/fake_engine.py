#!/usr/bin/env python3
"""A stand-in for vLLM's and SGLang's servers, for the process-management tests: started the
way xinf starts an engine (`<python> -m <module> --port N ...`), it speaks the two endpoints
xinf uses (vLLM `/v1/completions`, SGLang `/generate`, both streamed) and `/health`.

Output token i of a prompt is (sum(prompt) + 7 * i) % 40 + 3, its text "t<id> ". Asked for
log-probabilities (vLLM's `logprobs`, SGLang's `return_logprob`), token i has -(i + 1) / 4 and
the k alternatives asked for are itself and the ids after it, each 1 less likely than the last,
in each engine's shape. Asked for prompt log-probabilities (vLLM's `prompt_logprobs`, SGLang's
`logprob_start_len: 0`, in an answer that is not streamed), prompt token j (j >= 1) has -j / 8 - 1
and rank k + j, and the k alternatives at each position are ids 1000, 1001, ... with -0.1, -0.2,
... What it is asked to do is set by FAKE_ENGINE_MODE:
  ok              serve (the default)
  exit-at-start   print an error and exit 3 before listening
  never-healthy   listen, but answer /health with 503
  die-mid-stream  exit (status 9) after the first streamed token
  hang            answer /health until the first generation request, then nothing at all
                  (every request, /health too, is held open unanswered): a hung server
Run as `-c <code> <package>` it prints the package's version instead, as xinf asks an
interpreter before starting a server: the release xinf is made for, or FAKE_ENGINE_VERSION
("" for none). FAKE_STEP_MS delays each token; FAKE_START_S delays readiness; FAKE_PREFILL_MS delays the
answer of a non-streamed request (a prefill leg: vLLM's answer then names the room it was asked
to publish, as xinf's connector does; its one token is scored as the first streamed one). Every request, abort and disconnect is printed, so tests
read the log to see what reached the engine. Like vLLM, it refuses a request whose id it still has
running (400); FAKE_ID_LINGER_MS keeps an id running that long after its request ended, as a
server may for a moment after an abort.
"""
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
if args[:1] == ["-c"]:
    # xinf asking the interpreter for the engine's version (`-c <code> <package>`): the one
    # xinf is made for, or FAKE_ENGINE_VERSION ("" for an interpreter without the engine).
    wanted = {"vllm": "0.26.0", "sglang": "0.5.15"}.get(args[2], "")
    print(os.environ.get("FAKE_ENGINE_VERSION", wanted))
    sys.exit(0)
module = args[args.index("-m") + 1] if "-m" in args else ""
flavor = "sglang" if module.startswith("sglang") else "vllm"
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_ENGINE_MODE", "ok")
step = float(os.environ.get("FAKE_STEP_MS", "0")) / 1000.0
prefill_s = float(os.environ.get("FAKE_PREFILL_MS", "0")) / 1000.0
ready_at = time.time() + float(os.environ.get("FAKE_START_S", "0"))
print(f"fake {flavor} server starting: {' '.join(args)}", flush=True)
print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
if "SGLANG_RETURN_ORIGINAL_LOGPROB" in os.environ:
    print(f"SGLANG_RETURN_ORIGINAL_LOGPROB={os.environ['SGLANG_RETURN_ORIGINAL_LOGPROB']}", flush=True)
if mode == "exit-at-start":
    print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
    sys.exit(3)


hung_since = None
running = set()
running_lock = threading.Lock()
linger_s = float(os.environ.get("FAKE_ID_LINGER_MS", "0")) / 1000.0


def take_id(rid):
    """Whether `rid` was free (it is now running)."""
    with running_lock:
        if rid in running:
            return False
        running.add(rid)
        return True


def free_id(rid):
    def free():
        with running_lock:
            running.discard(rid)
    threading.Timer(linger_s, free).start() if linger_s else free()


def token(prompt, i):
    return (sum(prompt) + 7 * i) % 40 + 3


def scored(t, i, k):
    """Token t's (step i) log-probability and its k alternatives as (id, logprob) pairs."""
    lp = -(i + 1) / 4
    return lp, [(t + j, lp - j) for j in range(k)]


def vllm_logprobs(t, i, k):
    # vLLM lists up to k + 1: the sampled token besides the k most likely.
    lp, top = scored(t, i, k + 1)
    return {"tokens": [f"token_id:{t}"], "token_logprobs": [lp], "text_offset": [0],
            "top_logprobs": [{f"token_id:{a}": b for a, b in top}]}


def prompt_scores(prompt, k):
    """Per prompt position j >= 1: (the prompt token's logprob, its rank, the k alternatives)."""
    return [(-j / 8 - 1, k + j, [(1000 + m, -(m + 1) / 10) for m in range(k)]) for j in range(1, len(prompt))]


def sglang_meta(meta, body, t, i):
    if body.get("return_logprob"):
        lp, top = scored(t, i, body.get("top_logprobs_num") or 0)
        meta["output_token_logprobs"] = [[lp, t, None]]
        meta["output_top_logprobs"] = [[[b, a, None] for a, b in top]]
    return meta


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def hang_if_hung(self):
        """In `hang` mode, once a generation was asked for: hold the request for ever."""
        if mode == "hang" and hung_since:
            print(f"hung: {self.command} {self.path} held", flush=True)
            while True:
                time.sleep(3600)

    def do_GET(self):
        self.hang_if_hung()
        if self.path == "/health":
            healthy = mode != "never-healthy" and time.time() >= ready_at
            self.reply(200 if healthy else 503, {})
            # As uvicorn's access log has it in vLLM and SGLang.
            host, port = self.client_address[:2]
            print(f'INFO:     {host}:{port} - "GET /health HTTP/1.1" {200 if healthy else 503}', flush=True)
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        global hung_since
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        if mode == "hang":
            hung_since = hung_since or time.time()
        self.hang_if_hung()
        if self.path == "/abort_request":
            print(f"abort_request {body.get('rid')}", flush=True)
            self.reply(200, {})
            return
        if flavor == "vllm" and self.path == "/v1/completions":
            prompt, rid = body["prompt"], body.get("request_id")
            max_tokens = body.get("max_tokens") or 16
        elif flavor == "sglang" and self.path == "/generate":
            prompt, rid = body["input_ids"], body.get("rid")
            max_tokens = body["sampling_params"].get("max_new_tokens", 128)
        else:
            self.reply(404, {"detail": "Not Found"})
            return
        print(f"request {rid} prompt={len(prompt)} max_tokens={max_tokens}", flush=True)
        if max_tokens > 100000:
            self.reply(400, {"error": {"message": f"max_tokens {max_tokens} is too large (fake)"}})
            return
        if not take_id(rid):
            print(f"refused {rid}: already running", flush=True)
            self.reply(400, {"error": {"message": f"Request id {rid} already running."}})
            return
        try:
            self.answer(body, prompt, rid, max_tokens)
        finally:
            free_id(rid)

    def answer(self, body, prompt, rid, max_tokens):
        if body.get("stream") is False:
            self.answer_whole(body, prompt, rid)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            for i in range(max_tokens):
                time.sleep(step)
                t = token(prompt, i)
                last = i + 1 == max_tokens
                if flavor == "vllm":
                    choice = {"index": 0, "text": f"t{t} ", "token_ids": [t],
                              "finish_reason": "length" if last else None}
                    if body.get("logprobs") is not None:
                        choice["logprobs"] = vllm_logprobs(t, i, body["logprobs"])
                    send({"choices": [choice], "usage": None})
                else:
                    meta = {"id": rid, "prompt_tokens": len(prompt), "completion_tokens": i + 1,
                            "finish_reason": {"type": "length", "length": max_tokens} if last else None}
                    send({"text": f"t{t} ", "output_ids": [t], "meta_info": sglang_meta(meta, body, t, i)})
                if mode == "die-mid-stream":
                    print("fake engine dies mid-stream", flush=True)
                    os._exit(9)
            if flavor == "vllm":
                send({"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": max_tokens}})
            send(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            print(f"finished {rid}", flush=True)
        except (BrokenPipeError, ConnectionResetError):
            print(f"client disconnected {rid}", flush=True)

    def client_gone(self):
        """Whether the client closed its connection (readable, and nothing to read)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""

    def answer_whole(self, body, prompt, rid):
        """A non-streamed answer of one token after FAKE_PREFILL_MS, watching the client."""
        until = time.time() + prefill_s
        while time.time() < until:
            if self.client_gone():
                print(f"client disconnected {rid}", flush=True)
                return
            time.sleep(0.01)
        t = token(prompt, 0)
        if flavor == "vllm":
            choice = {"index": 0, "text": f"t{t} ", "token_ids": [t], "finish_reason": "length"}
            if body.get("prompt_logprobs") is not None:
                choice["prompt_logprobs"] = [None] + [
                    {str(p): {"logprob": lp, "rank": rank, "decoded_token": f"t{p} "},
                     **{str(a): {"logprob": b, "rank": m + 1, "decoded_token": f"t{a} "} for m, (a, b) in enumerate(top)}}
                    for p, (lp, rank, top) in zip(prompt[1:], prompt_scores(prompt, body["prompt_logprobs"]))]
            if body.get("logprobs") is not None:
                choice["logprobs"] = vllm_logprobs(t, 0, body["logprobs"])
            answer = {"choices": [choice]}
            room = ((body.get("kv_transfer_params") or {}).get("xinf") or {}).get("room")
            if room is not None:
                answer["kv_transfer_params"] = {"xinf": {"room": room, "endpoint": {"process": 1, "provider": 1, "tcp": "127.0.0.1:9"}}}
            self.reply(200, answer)
        else:
            meta = sglang_meta({"id": rid}, body, t, 0)
            if body.get("logprob_start_len") == 0:
                scores = prompt_scores(prompt, body.get("top_logprobs_num") or 0)
                meta["input_token_logprobs"] = [[None, prompt[0], None]] + [[lp, p, None] for p, (lp, _, _) in zip(prompt[1:], scores)]
                meta["input_top_logprobs"] = [None] + [[[b, a, None] for a, b in top] for _, _, top in scores]
            self.reply(200, {"text": f"t{t} ", "output_ids": [t], "meta_info": meta})
        print(f"finished {rid}", flush=True)


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
