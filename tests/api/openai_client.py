"""Drives xinf's REST API with the official `openai` Python client (run by tests/api.rs).

Chat and completions, streaming and not, stop strings, max_tokens, seed, usage, several
choices (`n`), log-probabilities, a batch of prompts, structured output (the client's own
`parse` with a pydantic model), function calling (a pydantic tool, its call parsed back,
streamed alike, then answered), and the client's error classes for a 404 (unknown model) and
400s (bad fields).
"""

import argparse
import json
import sys
from typing import Literal

import openai
import pydantic

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def expect_error(cls, needle, call):
    try:
        call()
    except cls as e:
        check(needle in str(e), f"{cls.__name__} should name {needle!r}: {e}")
        check(isinstance(e.body, dict) and "message" in e.body, f"error body: {e.body!r}")
        return
    except openai.APIError as e:  # any other class is a failure
        check(False, f"expected {cls.__name__}, got {type(e).__name__}: {e}")
    check(False, f"expected {cls.__name__}, the call succeeded")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="unused")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)
    model = args.model

    ids = [m.id for m in client.models.list().data]
    check(model in ids, f"{model} in {ids}")
    check(client.models.retrieve(model).id == model, "models.retrieve")

    # Chat, not streaming.
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=40)
    text = r.choices[0].message.content
    check(r.object == "chat.completion", r.object)
    check(r.choices[0].message.role == "assistant", r.choices[0].message.role)
    check("Paris" in text, text)
    check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    u = r.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 40, u)
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, u)

    # Chat, streaming, with usage: the same text and counts.
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"{streamed!r} != {text!r}")
    check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finishes == [r.choices[0].finish_reason], finishes)
    check(chunks[-1].usage is not None and not chunks[-1].choices, chunks[-1])
    check(chunks[-1].usage.completion_tokens == u.completion_tokens, chunks[-1].usage)

    # max_tokens (with an xinf extra: ignore_eos) and stop strings.
    r = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=3, extra_body={"ignore_eos": True}
    )
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3, r)
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=40, stop=["Paris"])
    check(r.choices[0].message.content == text[: text.index("Paris")], r.choices[0].message.content)
    check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)

    # A seed makes sampling reproducible.
    a, b = (
        client.chat.completions.create(model=model, messages=QUESTION, temperature=1.0, seed=7, max_tokens=16)
        .choices[0].message.content
        for _ in range(2)
    )
    check(a == b, f"{a!r} != {b!r}")

    # Completions, not streaming and streaming.
    c = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=8)
    check(c.object == "text_completion" and c.choices[0].text, c)
    check(0 < c.usage.completion_tokens <= 8, c.usage)
    parts = list(
        client.completions.create(
            model=model, prompt="The capital of France is", temperature=0, max_tokens=8, stream=True
        )
    )
    check("".join(x.choices[0].text for x in parts if x.choices) == c.choices[0].text, parts)
    s1 = client.completions.create(model=model, prompt="Once upon a time", temperature=1.0, seed=3, max_tokens=10)
    s2 = client.completions.create(model=model, prompt="Once upon a time", temperature=1.0, seed=3, max_tokens=10)
    check(s1.choices[0].text == s2.choices[0].text, (s1.choices[0].text, s2.choices[0].text))
    # A batch of prompts: the choices come prompt by prompt, each as the prompt alone gives it.
    batch = client.completions.create(
        model=model, prompt=["The capital of France is", "Once upon a time"], temperature=0, max_tokens=8
    )
    alone = client.completions.create(model=model, prompt="Once upon a time", temperature=0, max_tokens=8)
    check([x.index for x in batch.choices] == [0, 1], batch)
    check([x.text for x in batch.choices] == [c.choices[0].text, alone.choices[0].text], batch)
    check(batch.usage.prompt_tokens == c.usage.prompt_tokens + alone.usage.prompt_tokens, batch.usage)

    # Several choices: each its own, reproducible with a seed; streamed by index.
    kw = dict(model=model, messages=QUESTION, temperature=1.0, seed=11, max_tokens=8, n=3)
    r = client.chat.completions.create(**kw)
    check([c.index for c in r.choices] == [0, 1, 2], r.choices)
    texts = [c.message.content for c in r.choices]
    check(len(set(texts)) > 1, f"seeded choices should differ: {texts}")
    check(r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 0, r.usage)
    streamed = ["", "", ""]
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    check(streamed == texts, (streamed, texts))

    # Log-probabilities, as the client's types read them.
    r = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, content)
    check(all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content), content)
    check(all(t.top_logprobs[0].token == t.token for t in content), "greedy takes the most likely")
    c = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=4, logprobs=1)
    check(len(c.choices[0].logprobs.token_logprobs) == 4 and "".join(c.choices[0].logprobs.tokens) == c.choices[0].text, c)
    # A text scored as lm-evaluation-harness scores it: the prompt echoed with its tokens'
    # log-probabilities (the first None), then one output token.
    e = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=1,
                                  logprobs=1, echo=True)
    lp = e.choices[0].logprobs
    check(e.choices[0].text.startswith("The capital of France is"), e)
    check(len(lp.tokens) == e.usage.prompt_tokens + 1 and lp.token_logprobs[0] is None, lp)
    check(all(x <= 0 for x in lp.token_logprobs[1:]) and lp.top_logprobs[0] is None, lp)

    # Structured output through the client's own parsing: a pydantic model as the response format
    # (sent as a strict JSON Schema), its instance back.
    class City(pydantic.BaseModel):
        capital: str = pydantic.Field(max_length=24)
        country: Literal["France", "Spain", "Italy"]

    parsed = client.chat.completions.parse(
        model=model, messages=QUESTION, temperature=0, max_tokens=120, response_format=City
    )
    city = parsed.choices[0].message.parsed
    check(isinstance(city, City) and city.country in ("France", "Spain", "Italy"), parsed)
    ask = [{"role": "user", "content": 'Reply with JSON like {"answer": "..."}. What is the capital of France?'}]
    shaped = client.chat.completions.create(
        model=model, messages=ask, temperature=0, max_tokens=200, response_format={"type": "json_object"}
    )
    check(isinstance(json.loads(shaped.choices[0].message.content), dict), shaped)

    # Function calling: a pydantic model as the tool (the client's strict schema), called by
    # `required`; the arguments parsed back into an instance; streamed, the same call.
    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)

    weather_q = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [openai.pydantic_function_tool(GetWeather)]
    called = client.chat.completions.parse(
        model=model, messages=weather_q, tools=tools, tool_choice="required", temperature=0, max_tokens=60
    )
    msg = called.choices[0].message
    check(called.choices[0].finish_reason == "tool_calls" and msg.tool_calls, called)
    call = msg.tool_calls[0]
    check(call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather), call)
    deltas = {}
    for chunk in client.chat.completions.create(
        model=model, messages=weather_q, tools=tools, tool_choice="required", temperature=0, max_tokens=60, stream=True
    ):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = deltas.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
    check(deltas.get(0) == {"name": call.function.name, "arguments": call.function.arguments}, deltas)
    # The call and its answer go back into the conversation.
    follow = weather_q + [msg.model_dump(exclude_none=True, exclude={"parsed"}), {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}]
    for m in follow:
        for c in m.get("tool_calls", []):
            c["function"].pop("parsed_arguments", None)
    answer = client.chat.completions.create(model=model, messages=follow, tools=tools, tool_choice="none", temperature=0, max_tokens=10)
    check(answer.choices[0].message.content and not answer.choices[0].message.tool_calls, answer)

    # Errors come back as the client's classes, naming the model or the field.
    expect_error(
        openai.NotFoundError,
        "no-such-model",
        lambda: client.chat.completions.create(model="no-such-model", messages=QUESTION),
    )
    expect_error(
        openai.NotFoundError,
        "no-such-model",
        lambda: client.completions.create(model="no-such-model", prompt="hi"),
    )
    expect_error(
        openai.BadRequestError,
        "temperature",
        lambda: client.chat.completions.create(model=model, messages=QUESTION, temperature="hot"),
    )
    expect_error(
        openai.BadRequestError,
        "top_p",
        lambda: client.chat.completions.create(model=model, messages=QUESTION, top_p=0),
    )
    expect_error(
        openai.BadRequestError,
        "`n`",
        lambda: client.chat.completions.create(model=model, messages=QUESTION, n=17),
    )
    expect_error(
        openai.BadRequestError,
        "not_a_field",
        lambda: client.chat.completions.create(model=model, messages=QUESTION, extra_body={"not_a_field": 1}),
    )
    print("openai client: ok")


if __name__ == "__main__":
    main()
