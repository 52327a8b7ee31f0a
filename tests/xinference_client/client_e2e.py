"""Drives a running `xinf local` (started with `--api-key`) with Xinference's own Python client,
`xinference_client` from PyPI, as a user of Xinference would: keys, registry, engines, launches
(plain, without waiting, with prefill/decode roles), progress, descriptions, chat and generate
(streaming or not), abort, workers, terminate, and the server's error messages.

Usage: client_e2e.py BASE_URL API_KEY PRELOADED_UID
Prints one `ok <step>` line per step; any failure raises (non-zero exit).
"""

import json
import sys
import time

from xinference_client import RESTfulClient

BASE, KEY, PRELOADED = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = "smollm2-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def ok(step):
    print("ok", step, flush=True)


def fails(fn, *words):
    """Runs fn, which must raise; the message must carry each of words (the server's text)."""
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        assert "Client Error" not in text, f"no server message: {text}"
        for w in words:
            assert w in text, f"{w!r} not in {text!r}"
        return text
    raise AssertionError(f"{fn} did not fail")


def answer(handle, stream, **config):
    """The chat answer to QUESTION at temperature 0 (streamed or not)."""
    config = {"temperature": 0, "max_tokens": 24, **config}
    if not stream:
        out = handle.chat(QUESTION, generate_config=config)
        return out["choices"][0]["message"]["content"]
    chunks = handle.chat(QUESTION, generate_config={**config, "stream": True})
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        },
    }
]


def check_answers(client, uid):
    handle = client.get_model(uid)
    assert type(handle).__name__ == "RESTfulChatModelHandle", type(handle)
    for stream in (False, True):
        text = answer(handle, stream)
        assert "Paris" in text, f"{uid}, stream={stream}: {text!r}"
    done = handle.generate("The capital of France is", generate_config={"temperature": 0, "max_tokens": 8})
    assert done["object"] == "text_completion" and done["choices"][0]["text"], done
    chunks = list(
        handle.generate(
            "The capital of France is", generate_config={"temperature": 0, "max_tokens": 8, "stream": True}
        )
    )
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed == done["choices"][0]["text"], (streamed, done)
    # Function calling through the client's `tools`, the call required.
    called = handle.chat(
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=WEATHER_TOOLS,
        generate_config={"tool_choice": "required", "temperature": 0, "max_tokens": 60},
    )
    choice = called["choices"][0]
    call = (choice["message"].get("tool_calls") or [{}])[0].get("function", {})
    assert choice["finish_reason"] == "tool_calls" and call.get("name") == "get_weather", called
    assert isinstance(json.loads(call["arguments"]).get("city"), str), called


def wait_progress(client, uid):
    deadline = time.time() + 300
    seen = []
    while True:
        p = client.get_launch_model_progress(uid)["progress"]
        seen.append(p)
        assert 0.0 <= p <= 1.0, p
        if p >= 1.0:
            return seen
        assert time.time() < deadline, f"{uid} still loading: {seen[-5:]}"
        time.sleep(0.2)


def main():
    # A key is needed: the client learns it from /v1/cluster/auth and sends it only then.
    fails(lambda: RESTfulClient(BASE).list_models(), "API key")
    fails(lambda: RESTfulClient(BASE, api_key="wrong").list_models(), "API key")
    ok("api key refused when missing or wrong")
    client = RESTfulClient(BASE, api_key=KEY)

    models = client.list_models()
    assert PRELOADED in models and models[PRELOADED]["model_type"] == "LLM", models
    ok("list_models")

    names = [r["model_name"] for r in client.list_model_registrations("LLM")]
    assert MODEL in names, names
    detailed = client.list_model_registrations("LLM", detailed=True)
    assert all(r["model_specs"] for r in detailed), detailed
    reg = client.get_model_registration("LLM", MODEL)
    assert reg["model_name"] == MODEL and reg["model_specs"], reg
    assert client.list_model_registrations("embedding") == []
    fails(lambda: client.get_model_registration("LLM", "no-such-model"), "`no-such-model` does not exist")
    ok("model registrations")

    engines = client.query_engine_by_model_name(MODEL)
    assert "native" in engines, engines
    assert any(p["model_format"] == "ggufv2" for p in engines["native"]), engines
    assert client.query_engine_by_model_name(MODEL, model_type=None) == engines
    fails(lambda: client.query_engine_by_model_name("no-such-model"), "no-such-model")
    ok("engines")

    # Unsupported Xinference keys are refused by name; the ones it sends as null are not. Bad
    # values of the launch keys xinf takes are refused by name too.
    fails(lambda: client.launch_model(MODEL, model_uid="xc-bad", envs={"A": "1"}), "envs")
    fails(lambda: client.launch_model(MODEL, model_uid="xc-bad", request_limits=0), "request_limits")
    fails(lambda: client.launch_model(MODEL, model_uid="xc-bad", reasoning_content=True), "reasoning_content")
    fails(lambda: client.launch_model("no-such-model", model_uid="xc-bad"), "no-such-model")
    assert "xc-bad" not in client.list_models()
    ok("launch refusals carry the server's message")

    uid = client.launch_model(MODEL, model_uid="xc-plain")
    assert uid == "xc-plain", uid
    assert client.get_launch_model_progress(uid)["progress"] == 1.0
    desc = client.describe_model(uid)
    assert desc["model_type"] == "LLM" and "chat" in desc["model_ability"], desc
    assert desc["model_name"] == MODEL and desc["replica"] == 1, desc
    check_answers(client, uid)
    ok("plain launch, describe, chat and generate (streaming and not)")

    uid = client.launch_model(MODEL, model_uid="xc-async", wait_ready=False)
    assert uid == "xc-async", uid
    seen = wait_progress(client, uid)
    check_answers(client, uid)
    ok(f"launch without waiting, progress {seen[0]} .. {seen[-1]}")

    uid = client.launch_model(
        MODEL, model_uid="xc-pd", replica=2, replica_config=[{"role": "prefill"}, {"role": "decode"}]
    )
    desc = client.describe_model(uid)
    assert desc["replica"] == 2, desc
    roles = sorted(r["role"] for r in desc["xinf"]["replica_details"])
    assert roles == ["decode", "prefill"], roles
    check_answers(client, uid)
    ok("prefill/decode launch through replica_config")

    # Abort a streaming request by its id.
    handle = client.get_model("xc-plain")
    chunks = handle.chat(
        QUESTION,
        generate_config={"max_tokens": 4000, "stream": True, "request_id": "xc-req-1", "ignore_eos": True},
    )
    first = next(chunks)
    assert first["id"] == "xc-req-1", first
    assert client.abort_request("xc-plain", "xc-req-1") == {"msg": "DONE"}
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "abort", finish[-5:]
    assert client.abort_request("xc-plain", "xc-req-1") == {"msg": "NOT_FOUND"}
    ok("abort_request")

    workers = client.get_workers_info()
    assert isinstance(workers, list) and workers, workers
    ok("get_workers_info")

    fails(lambda: client.get_model("no-such-uid"), "no-such-uid")
    fails(lambda: client.describe_model("no-such-uid"), "no-such-uid")
    fails(lambda: client.get_launch_model_progress("no-such-uid"), "no-such-uid")
    fails(lambda: client.get_model("xc-plain").chat(QUESTION, generate_config={"n": 17}), "between 1 and 16")
    ok("errors carry the server's message")

    for uid in ("xc-plain", "xc-async", "xc-pd"):
        client.terminate_model(uid)
    fails(lambda: client.terminate_model("xc-plain"), "xc-plain")
    left = client.list_models()
    assert set(left) == {PRELOADED}, left
    ok("terminate_model")


if __name__ == "__main__":
    main()
