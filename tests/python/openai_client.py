"""The official `openai` client against `mtrl serve` on the tiny fixture model (run by
tests/serve_openai.rs with the pinned venv of scripts/agent-venv.sh).

    python tests/python/openai_client.py http://127.0.0.1:PORT TOKEN

Checks: the model list; chat with tools, logprobs and `return_token_ids` (the log-probs the
client sees are the ones captured); streaming with usage; text completions; `/sample`;
errors (400 naming the field, 401 without the token, 404 for an unknown trajectory, the turn
budget of a trajectory); a captured trajectory read back through `GET /trajectories/<id>`.
Prints one JSON line of figures and exits 0, or raises.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.request

import openai

base, token = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)

TOOLS = [{"type": "function", "function": {
    "name": "bm25_search", "description": "BM25 search",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
MESSAGES = [{"role": "system", "content": "You are a search agent."},
            {"role": "user", "content": "Query: flutter of wings"}]


def raw(method: str, path: str, body: dict | None = None, bearer: str = token) -> dict:
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {bearer}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


models = client.models.list()
model = models.data[0].id
assert model == "tiny-qwen3", model

# Chat with tools and log-probs.
r = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                   temperature=0, max_tokens=12, logprobs=True,
                                   extra_body={"return_token_ids": True})
c = r.choices[0]
assert c.message.role == "assistant"
assert c.finish_reason in ("stop", "length", "tool_calls"), c.finish_reason
lp = c.logprobs.content
assert len(lp) == r.usage.completion_tokens == len(c.model_extra["token_ids"]), (len(lp), r.usage)
assert all(t.logprob <= 0 and math.isfinite(t.logprob) for t in lp)
assert r.usage.prompt_tokens == len(c.model_extra["prompt_token_ids"])
greedy = [t.logprob for t in lp]
# Greedy is deterministic: the same call gives the same tokens and log-probs.
r2 = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=0,
                                    max_tokens=12, logprobs=True)
assert [t.logprob for t in r2.choices[0].logprobs.content] == greedy
assert r2.choices[0].message.content == c.message.content

# n choices with a seed are reproducible.
a = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=3, seed=7)
b = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=3, seed=7)
assert len(a.choices) == 3
assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]

# Streaming, with usage in the last chunk.
chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=12,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
assert text == c.message.content, (text, c.message.content)
assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [c.finish_reason]

# Text completions.
t = client.completions.create(model=model, prompt="The wing", max_tokens=5, temperature=0, logprobs=1)
assert len(t.choices[0].logprobs.token_logprobs) == t.usage.completion_tokens

# Errors: a bad field names it; a missing token; an unknown trajectory.
try:
    client.chat.completions.create(model=model, messages=MESSAGES, temperature=9)
    raise AssertionError("temperature 9 was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body
try:
    client.chat.completions.create(model=model, messages=[{"role": "robot", "content": "x"}])
    raise AssertionError("role robot was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "messages[0].role", e.body
try:
    openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong token was accepted")
except openai.AuthenticationError:
    pass
try:
    client.chat.completions.create(model=model, messages=MESSAGES,
                                   extra_headers={"X-Amzn-SageMaker-Trajectory-Id": "mtrl-unknown"})
    raise AssertionError("an unknown trajectory was served")
except openai.NotFoundError as e:
    assert e.body["code"] == "unknown_trajectory", e.body

# A captured trajectory: its id is the API key; what the client saw is what was recorded.
tid = raw("POST", "/trajectories", {})["id"]
tc = openai.OpenAI(base_url=f"{base}/v1", api_key=tid, max_retries=0)
seen = []
for turn in range(64):
    try:
        x = tc.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=4,
                                       logprobs=True, extra_body={"return_token_ids": True})
    except openai.BadRequestError as e:
        # The random fixture never ends its message: the first call spends the token budget.
        assert e.body["code"] == "trajectory_ended", e.body
        break
    seen.append(x.choices[0])
rec = raw("GET", f"/trajectories/{tid}")
assert rec["failure"] == "token_limit", rec["failure"]
assert rec["turns"] == len(seen) == 1
sampled = [i for i, m in enumerate(rec["loss_mask"]) if m == 1]
assert [rec["tokens"][i] for i in sampled] == seen[0].model_extra["token_ids"]
assert [rec["logprobs"][i] for i in sampled] == [t.logprob for t in seen[0].logprobs.content]
assert rec["tokens"][:rec["prompt_len"]] == seen[0].model_extra["prompt_token_ids"]

# /sample: ids in, ids and log-probs out.
s = raw("POST", "/sample", {"input_ids": rec["tokens"][:rec["prompt_len"]], "max_tokens": 4, "temperature": 0})
assert s["output_ids"] == seen[0].model_extra["token_ids"], (s, seen[0].model_extra["token_ids"])
assert s["logprobs"] == rec["logprobs"][rec["prompt_len"]:]

print(json.dumps({"model": model, "completion_tokens": r.usage.completion_tokens, "stream_chunks": len(chunks),
                  "captured_tokens": len(rec["tokens"])}))
