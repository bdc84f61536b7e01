#!/usr/bin/env python3
"""A plain Python search agent for mtrl: the `openai` client and the standard library only.

It is the HTTP twin of the in-process environment `SearchEnv` (crates/mtrl-env/src/search_env.rs):
the same conversation, the same tool-call handling and argument shortcuts (shortcuts.rs), the
same error texts, the same nDCG@10 (crates/mtrl-search/src/metrics.rs). With greedy decoding it
must produce the trajectories and rewards the in-process environment produces on the same tasks.

It speaks the "sagemaker" rollout protocol: `POST /` or `POST /invocations` with

    {"prompt": "{\"query\": …, \"qrels\": {…}}",
     "metadata": {"trajectoryId": "mtrl-…", "endpoint": "http://127.0.0.1:PORT", …},
     "inferenceParams": {"temperature": …, "top_p": …, "max_tokens": …, "model": …}}

and answers `{"reward": x, "metrics": {"ndcg@10": x}}`, or `{"status": "failed", "failure":
"<reason>"}` when the episode failed (mtrl substitutes its failure reward). The policy is
`<endpoint>/v1`, called with the trajectory id as API key and as `X-Amzn-SageMaker-Trajectory-Id`;
the tools are `mtrl serve-tools` (`--tools-url`).

    python examples/agents/plain_agent.py --port 8080 --tools-url http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from math import log2
from typing import Any

import openai

TRAJECTORY_HEADER = "X-Amzn-SageMaker-Trajectory-Id"
FINAL_TOOL = "submit"
SAMPLING_KEYS = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "n"}


# ---------------------------------------------------------------------------------------------
# The task and the reward


@dataclass
class Task:
    query: str
    qrels: dict[str, int]
    messages: list[dict[str, Any]] = field(default_factory=list)


def _grade(value: Any) -> int:
    """A judgment grade as task.rs reads it: an integer, an integral float, a numeric string, a bool."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e9:
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(f"grade is not an integer: {value!r}")


def parse_task(prompt: str) -> Task:
    """The task prompt column: JSON `{"query": …, "qrels": {doc: grade}, "messages"?: […]}`."""
    spec = json.loads(prompt)
    query = spec.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError("the prompt has no query")
    qrels = {doc: _grade(g) for doc, g in (spec.get("qrels") or {}).items()}
    return Task(query=query, qrels=qrels, messages=list(spec.get("messages") or []))


def ndcg_at_k(ranked: list[str], judged: dict[str, int], k: int = 10) -> float:
    """nDCG@k with trec_eval's conventions, exactly as mtrl_search::metrics::ndcg_at_k:
    gain = max(grade, 0), unjudged gain 0, discount log2(rank + 1), a repeated id counts once
    (first position), the ideal ranking over all judged documents with a positive gain."""
    seen: set[str] = set()
    unique = [d for d in ranked if not (d in seen or seen.add(d))]
    dcg = 0.0  # plain left-to-right sums, as Rust's `Iterator::sum` (Python 3.12's sum() compensates)
    for i, doc in enumerate(unique[:k]):
        dcg += max(judged.get(doc, 0), 0) / log2(i + 2)
    ideal = sorted((float(g) for g in judged.values() if g > 0), reverse=True)
    idcg = 0.0
    for i, gain in enumerate(ideal[:k]):
        idcg += gain / log2(i + 2)
    return dcg / idcg if idcg > 0.0 else 0.0


# ---------------------------------------------------------------------------------------------
# The tool service (`mtrl serve-tools`)


class ToolError(Exception):
    """A call's arguments were refused; the message is shown to the model as `error: <message>`."""


@dataclass
class Catalog:
    """`GET /tools`: the schemas shown to the model, the system prompt, the `[env]` settings."""

    schemas: list[dict[str, Any]]
    system_prompt: str
    env: dict[str, Any]

    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    def schema(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.schemas if s["function"]["name"] == name), None)

    def setting(self, key: str, default: Any) -> Any:
        value = self.env.get(key)
        return default if value is None else value


@dataclass
class Outcome:
    content: str
    ids: list[str]
    answer: list[str] | None


class ToolService:
    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()

    def _request(self, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if data is None else "POST")
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                raise RuntimeError(f"{path}: HTTP {e.code}: {raw[:200]!r}") from None

    def catalog(self) -> Catalog:
        """Fetched once per process (the tool service's configuration does not change)."""
        with self._lock:
            if self._catalog is None:
                status, body = self._request("/tools")
                if status != 200:
                    raise RuntimeError(f"GET /tools: HTTP {status}: {body}")
                self._catalog = Catalog(body["tools"], body["system_prompt"], body.get("env") or {})
            return self._catalog

    def shortcuts(self, name: str, arguments: Any, question: str, earlier: list["CallRecord"]) -> Any:
        body = {
            "arguments": arguments,
            "question": question,
            "earlier": [{"name": c.name, "ids": c.result_ids, "error": c.error} for c in earlier],
        }
        status, reply = self._request(f"/shortcuts/{name}", body)
        if status == 422:
            raise ToolError(reply["error"]["message"])
        if status != 200:
            raise RuntimeError(f"POST /shortcuts/{name}: HTTP {status}: {reply}")
        return reply["arguments"]

    def call(self, name: str, arguments: Any) -> Outcome:
        status, body = self._request(f"/tools/{name}", arguments)
        if status == 422:
            raise ToolError(body["error"]["message"])
        if status != 200:
            raise RuntimeError(f"POST /tools/{name}: HTTP {status}: {body}")
        return Outcome(body["content"], list(body.get("ids") or []), body.get("answer"))


# ---------------------------------------------------------------------------------------------
# Argument shortcuts (crates/mtrl-env/src/shortcuts.rs)


@dataclass
class CallRecord:
    """What shortcuts read of an earlier call: its tool, the ids it returned, whether it failed."""

    name: str
    result_ids: list[str]
    error: str | None


def resolve(tools: "ToolService", name: str, arguments: Any, question: str, earlier: list[CallRecord]) -> Any:
    """`arguments` with the enabled shortcuts resolved (`POST /shortcuts/<name>`: the in-process
    environment's own resolution, shortcuts.rs); ToolError with the message shown otherwise."""
    return tools.shortcuts(name, arguments, question, earlier)


# ---------------------------------------------------------------------------------------------
# One episode (SearchEnv::reset / step / finish)


@dataclass
class ParsedCall:
    """One `<tool_call>` block of the assistant's message: a call, or why it could not be read."""

    id: str | None
    name: str
    arguments: Any
    error: str | None = None


def parsed_calls(message: Any) -> list[ParsedCall]:
    """The message's calls in the order the model wrote them.

    Well-formed blocks come as `tool_calls`; mtrl reports the unreadable ones in the extension
    `invalid_tool_calls: [{"error": …, "index"?: n}]`, where `index` is the block's position among
    all blocks (without it, they are taken to follow the well-formed ones)."""
    calls: list[ParsedCall] = []
    for tc in message.tool_calls or []:
        raw = tc.function.arguments
        try:
            args = json.loads(raw) if raw and raw.strip() else {}
        except ValueError:
            args = None
        if isinstance(args, dict):
            calls.append(ParsedCall(tc.id, tc.function.name.strip(), args))
        else:  # parser.rs: a block whose arguments are not an object is an error, not a call
            calls.append(ParsedCall(tc.id, "error", None, "`arguments` must be a JSON object"))
    invalid = (getattr(message, "model_extra", None) or {}).get("invalid_tool_calls") or []
    placed = [b for b in invalid if isinstance(b.get("index"), int)]
    for bad in sorted(placed, key=lambda b: b["index"]) + [b for b in invalid if b not in placed]:
        at = min(bad.get("index", len(calls)), len(calls))
        calls.insert(at, ParsedCall(None, "error", None, str(bad.get("error", "invalid tool call"))))
    return calls


def assistant_message(message: Any) -> dict[str, Any]:
    """The server's reply as the agent sends it back (only the OpenAI fields)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
            for tc in message.tool_calls
        ]
    return out


def failed(reason: str) -> dict[str, Any]:
    return {"status": "failed", "failure": reason}


def policy_client(endpoint: str, trajectory_id: str, timeout: float) -> openai.OpenAI:
    base = endpoint.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    # No retries: a retried call would be a second model call (a second turn) of the trajectory.
    return openai.OpenAI(
        base_url=base,
        api_key=trajectory_id,
        default_headers={TRAJECTORY_HEADER: trajectory_id},
        max_retries=0,
        timeout=timeout,
    )


def run_episode(payload: dict[str, Any], tools: ToolService, timeout: float = 600.0) -> dict[str, Any]:
    """One episode of the task in `payload`: its result for mtrl."""
    meta = payload.get("metadata") or {}
    with policy_client(meta["endpoint"], meta["trajectoryId"], timeout) as client:
        return episode(client, parse_task(payload["prompt"]), dict(payload.get("inferenceParams") or {}), tools)


def episode(client: openai.OpenAI, task: Task, params: dict[str, Any], tools: ToolService) -> dict[str, Any]:
    model = params.pop("model", None) or client.models.list().data[0].id
    sampling = {k: params.pop(k) for k in list(params) if k in SAMPLING_KEYS}

    catalog = tools.catalog()
    max_turns = int(catalog.setting("max_turns", 8))
    max_calls = int(catalog.setting("max_calls_per_turn", 8))
    names = catalog.names()
    messages: list[dict[str, Any]] = [{"role": "system", "content": catalog.system_prompt}]
    messages += task.messages
    messages.append({"role": "user", "content": f"Query: {task.query}"})
    earlier: list[CallRecord] = []

    for turn in range(1, max_turns + 1):
        try:
            response = client.chat.completions.create(
                model=model,
                messages=messages,
                **({"tools": catalog.schemas} if catalog.schemas else {}),
                **sampling,
                **({"extra_body": params} if params else {}),
            )
        except openai.BadRequestError as e:
            code = e.code  # mtrl's budget errors: {"error": {"code": …}}
            if code == "context_length_exceeded":
                return failed("context_overflow")
            if code == "turn_budget_exceeded":
                return failed("turn_limit")
            raise
        choice = response.choices[0]
        if choice.finish_reason == "length":
            return failed("token_limit")
        message = choice.message
        calls = parsed_calls(message)
        messages.append(assistant_message(message))
        if not calls:
            return failed("no_answer")

        replies: list[dict[str, Any]] = []
        bad_answer = False
        for i, call in enumerate(calls):
            name, ids, error = call.name, [], call.error
            content = ""
            if i >= max_calls:
                name = "error"
                error = f"too many tool calls in one message (at most {max_calls}); this one was not run"
            elif error is None and name not in names:
                error = f"unknown tool `{name}` (available: {', '.join(names)})"
            elif error is None:
                try:
                    args = resolve(tools, name, call.arguments, task.query, earlier)
                    out = tools.call(name, args)
                except ToolError as e:
                    error = str(e)
                    bad_answer |= name == FINAL_TOOL
                else:
                    if out.answer is not None:
                        reward = ndcg_at_k(list(out.answer), task.qrels, 10)
                        return {"reward": reward, "metrics": {"ndcg@10": reward}}
                    ids, content = out.ids, out.content
            earlier.append(CallRecord(name, ids, error))
            reply: dict[str, Any] = {"role": "tool", "content": content if error is None else f"error: {error}"}
            if call.id is not None:
                reply["tool_call_id"] = call.id
            reply["name"] = name
            replies.append(reply)
        if turn >= max_turns:
            return failed("invalid_answer" if bad_answer else "turn_limit")
        messages += replies
    return failed("turn_limit")


# ---------------------------------------------------------------------------------------------
# The HTTP server


def check_payload(payload: Any) -> None:
    """Raises when `payload` is not a rollout request this agent can run."""
    meta = payload["metadata"]
    for key in ("trajectoryId", "endpoint"):
        if not isinstance(meta[key], str):
            raise ValueError(f"metadata.{key} must be a string")
    parse_task(payload["prompt"])


def make_handler(tools: ToolService, timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path in ("/ping", "/healthz"):
                self._reply(200, {"status": "Healthy"})
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/", "/invocations"):
                self._reply(404, {"error": f"no route {self.path}"})
                return
            try:
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                check_payload(payload)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                self._reply(400, {"error": f"bad rollout payload: {type(e).__name__}: {e}"})
                return
            try:
                self._reply(200, run_episode(payload, tools, timeout))
            except Exception as e:  # the rollout errored (not the policy's fault): mtrl retries or fails it
                self.log_error("episode failed: %r", e)
                self._reply(500, {"error": f"{type(e).__name__}: {e}"})

        def log_message(self, fmt: str, *args: Any) -> None:
            if os.environ.get("MTRL_AGENT_LOG"):
                super().log_message(fmt, *args)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the default listen backlog (5) resets connections under mtrl's concurrency


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default=os.environ.get("MTRL_AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("MTRL_AGENT_PORT", "8080")), help="0: any free port")
    p.add_argument("--tools-url", default=os.environ.get("MTRL_TOOLS_URL", "http://127.0.0.1:8001"))
    p.add_argument("--tools-token", default=os.environ.get("MTRL_TOOLS_TOKEN"))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP call")
    a = p.parse_args(argv)
    server = Server((a.host, a.port), make_handler(ToolService(a.tools_url, a.tools_token), a.timeout))
    host, port = server.server_address[:2]
    print(f"plain_agent listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
