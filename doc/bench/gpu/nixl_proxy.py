#!/usr/bin/env python3
"""The two legs of vLLM's own P/D (NixlConnector), as vLLM's example proxy plays them, for the
anchor row of `vllm-nixl.sh`: `/v1/completions` (streamed or not) is sent to the prefill server
with `max_tokens` 1 and `kv_transfer_params` {"do_remote_decode": true}; the decode server then
gets the original request with the `kv_transfer_params` the prefill answered, and its answer is
passed through as it comes. Standard library only, one thread per connection.

usage: nixl_proxy.py PORT PREFILL_URL DECODE_URL
"""

import http.client
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, PREFILL, DECODE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
TIMEOUT_S = 600


def connect(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT_S)


def prefill(body):
    leg = dict(body, max_tokens=1, stream=False)
    leg.pop("stream_options", None)
    leg["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    conn = connect(PREFILL)
    conn.request("POST", "/v1/completions", json.dumps(leg), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    if answer.status != 200:
        raise RuntimeError(f"prefill answered {answer.status}: {data[:300]!r}")
    return json.loads(data).get("kv_transfer_params")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, data, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        conn = connect(DECODE)
        conn.request("GET", self.path)
        answer = conn.getresponse()
        self.reply(answer.status, answer.read())
        conn.close()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        try:
            params = prefill(body)
        except Exception as e:  # the bench counts it as an error
            self.reply(502, json.dumps({"error": {"message": str(e)}}).encode())
            return
        body["kv_transfer_params"] = params
        conn = connect(DECODE)
        conn.request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        if not body.get("stream"):
            self.reply(answer.status, answer.read())
            conn.close()
            return
        self.send_response(answer.status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            line = answer.readline()
            if not line:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        conn.close()


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
