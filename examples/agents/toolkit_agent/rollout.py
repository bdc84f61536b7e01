"""What both toolkit apps run: the strands search agent, configured the agentcore-rl-toolkit way.

The trainer adds a block to the task payload, `_config` (the toolkit's current backends) or
`_rollout` (its `@rollout_entrypoint` examples), with the policy's `base_url` (ending in
`/v1`), `model_id` and `api_key`, the capture session id, which the model client sends as its
Bearer token. mtrl makes it the trajectory id. Nothing else points the agent at mtrl.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "search_agent"))
from strands_search import ToolService, openai_model, parse_task, run_episode  # noqa: E402

tools = ToolService(os.environ.get("MTRL_TOOLS_URL", "http://127.0.0.1:8001"), os.environ.get("MTRL_TOOLS_TOKEN"))


async def rollout(payload: dict[str, Any]) -> dict[str, Any]:
    """One episode of the task in `payload["prompt"]` (mtrl's prompt column, verbatim)."""
    cfg = payload.get("_config") or payload.get("_rollout") or {}
    model = openai_model(
        base_url=cfg["base_url"],
        model_id=cfg.get("model_id") or "mtrl",
        api_key=cfg.get("api_key") or "EMPTY",  # "EMPTY": an endpoint that captures nothing
        params=cfg.get("sampling_params") or {},
    )
    prompt = payload.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError("the payload's `prompt` must be the task's prompt string")
    return await run_episode(parse_task(prompt), model, tools)
