"""The strands search agent: one episode against an OpenAI-compatible policy and `mtrl serve-tools`.

The tools are strands `@tool` functions with the schemas `GET /tools` serves; arguments go
through mtrl's shortcuts (`POST /shortcuts/<name>`, the in-process resolution), at most
`max_calls_per_turn` calls run per message, no model call is made after an answer or after
`max_turns` messages, and the reward is the answer's nDCG@10. Used by `app.py`
(bedrock-agentcore) and by `../toolkit_agent/` (agentcore-rl-toolkit).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import BeforeModelCallEvent
from strands.models.openai import OpenAIModel
from strands.tools.executors import SequentialToolExecutor
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

# The tool-service client, the shortcuts and the metric are the plain agent's (one definition).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from plain_agent import (  # noqa: E402
    FINAL_TOOL,
    SAMPLING_KEYS,
    CallRecord,
    Catalog,
    Task,
    ToolError,
    ToolService,
    ndcg_at_k,
    parse_task,
    resolve,
)

__all__ = ["ToolService", "Task", "parse_task", "openai_model", "run_episode"]


@dataclass
class Episode:
    task: Task
    catalog: Catalog
    tools: ToolService
    turns: int = 0
    calls_this_turn: int = 0
    bad_answer: bool = False
    earlier: list[CallRecord] = field(default_factory=list)
    reward: float | None = None

    def setting(self, key: str, default: int) -> int:
        return int(self.catalog.setting(key, default))

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """One tool call as the in-process environment runs it; the text shown to the model."""
        self.calls_this_turn += 1
        max_calls = self.setting("max_calls_per_turn", 8)
        if self.reward is not None:
            return "error: the episode has ended"  # calls after a valid submit are not run
        if self.calls_this_turn > max_calls:
            self.earlier.append(CallRecord("error", [], "too many"))
            return f"error: too many tool calls in one message (at most {max_calls}); this one was not run"
        try:
            args = resolve(self.tools, name, arguments, self.task.query, self.earlier)
            out = self.tools.call(name, args)
        except ToolError as e:
            self.bad_answer |= name == FINAL_TOOL
            self.earlier.append(CallRecord(name, [], str(e)))
            return f"error: {e}"
        self.earlier.append(CallRecord(name, out.ids, None))
        if out.answer is not None:
            self.reward = ndcg_at_k(list(out.answer), self.task.qrels, 10)
        return out.content

    def before_model_call(self, event: BeforeModelCallEvent) -> None:
        """Counts turns; cancels the model call after an answer or after `max_turns` turns."""
        if self.reward is not None or self.turns >= self.setting("max_turns", 8):
            event.cancel = "episode over"
            return
        self.turns += 1
        self.calls_this_turn = 0
        self.bad_answer = False  # as in-process: whether *this* turn's submit was refused

    def result(self) -> dict[str, Any]:
        if self.reward is not None:
            return {"reward": self.reward, "metrics": {"ndcg@10": self.reward}}
        if self.calls_this_turn == 0:  # the last message called no tool
            return failed("no_answer")
        return failed("invalid_answer" if self.bad_answer else "turn_limit")


def failed(reason: str) -> dict[str, Any]:
    return {"status": "failed", "failure": reason}


def strands_tool(episode: Episode, schema: dict[str, Any]) -> Any:
    """A served tool as a strands `@tool`: the served name, description and parameter schema."""
    f = schema["function"]
    name = f["name"]
    params = f.get("parameters") or {"type": "object", "properties": {}}

    def run(**arguments: Any) -> str:
        return episode.call(name, {k: v for k, v in arguments.items() if v is not None})

    # strands reads the call's parameters from the signature: one optional keyword per property.
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Any)
            for p in params.get("properties", {})
        ]
    )
    run.__name__ = name
    return tool(name=name, description=f.get("description", ""), inputSchema={"json": params})(run)


def strands_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A task's few-shot `messages` (user/assistant text) in strands' message shape."""
    out = []
    for m in messages:
        if m.get("role") not in ("user", "assistant"):
            raise ValueError(f"task message role {m.get('role')!r}: only user and assistant turns are supported")
        out.append({"role": m["role"], "content": [{"text": m.get("content") or ""}]})
    return out


def openai_model(
    base_url: str,
    model_id: str,
    api_key: str,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> OpenAIModel:
    """strands' OpenAI provider on an OpenAI-compatible endpoint (`base_url` ends with `/v1`)."""
    params = dict(params or {})
    extra = {k: params.pop(k) for k in list(params) if k not in SAMPLING_KEYS}
    if extra:  # parameters the openai client has no argument for
        params["extra_body"] = extra
    client_args: dict[str, Any] = {"base_url": base_url, "api_key": api_key, "max_retries": 0}
    if headers:
        client_args["default_headers"] = headers
    # max_retries = 0: a retried call would be one more model call (turn) of the trajectory.
    return OpenAIModel(client_args=client_args, model_id=model_id, params=params)


async def run_episode(task: Task, model: OpenAIModel, tools: ToolService) -> dict[str, Any]:
    """One episode: `{"reward": x, "metrics": {…}}` or `{"status": "failed", "failure": …}`."""
    episode = Episode(task, tools.catalog(), tools)
    agent = Agent(
        model=model,
        tools=[strands_tool(episode, s) for s in episode.catalog.schemas],
        system_prompt=episode.catalog.system_prompt,
        messages=strands_messages(task.messages),
        conversation_manager=NullConversationManager(),  # never rewrite the history
        tool_executor=SequentialToolExecutor(),  # calls run in the order written
        callback_handler=None,
    )
    agent.hooks.add_callback(BeforeModelCallEvent, episode.before_model_call)
    try:
        await agent.invoke_async(f"Query: {task.query}")
    except MaxTokensReachedException:
        return failed("token_limit")
    except ContextWindowOverflowException:
        return failed("context_overflow")
    return episode.result()
