#!/usr/bin/env python3
"""The search agent as an agentcore-rl-toolkit `AgentCoreRuntimeApp` (the toolkit's current API).

`POST /invocations` with the task payload plus `_config` {base_url, model_id, api_key}; the
toolkit's `_agentcore_runtime` envelope {"version": 1, "operation": "start" | "get",
"invocation_id": …, "background": bool} makes the rollout addressable: a foreground start
answers the finished state, a background start answers `in_progress` and `get` polls it:

    {"version": 1, "invocation_id": …, "status": "completed", "result": {"reward": …, …}}

Without the envelope it is an ordinary bedrock-agentcore app (the result is the response).

    python examples/agents/toolkit_agent/app.py --port 8080 --tools-url http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from agentcore_rl_toolkit import AgentCoreRuntimeApp
from rollout import rollout, tools

app = AgentCoreRuntimeApp()


@app.entrypoint
async def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return await rollout(payload)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="mtrl search agent (agentcore-rl-toolkit AgentCoreRuntimeApp)")
    p.add_argument("--host", default=os.environ.get("MTRL_AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("MTRL_AGENT_PORT", "8080")))
    p.add_argument("--tools-url", help="mtrl serve-tools (default: $MTRL_TOOLS_URL or http://127.0.0.1:8001)")
    a = p.parse_args()
    if a.tools_url:
        tools.url = a.tools_url.rstrip("/")
    app.run(port=a.port, host=a.host)
