#!/usr/bin/env python3
"""The search agent on the managed service's own stack: a `strands-agents` agent (OpenAI model
provider pointed at `mtrl serve`) inside a `bedrock-agentcore` app, calling `mtrl serve-tools`.

It takes the "sagemaker" rollout payload on `POST /invocations` (the app also answers
`GET /ping`):

    {"prompt": "{\"query\": …, \"qrels\": {…}}",
     "metadata": {"trajectoryId": "mtrl-…", "endpoint": "http://127.0.0.1:PORT", …},
     "inferenceParams": {"temperature": …, "top_p": …, "max_tokens": …, "model": …}}

and answers `{"reward": nDCG@10, "metrics": {"ndcg@10": …}}`, or `{"status": "failed",
"failure": …}` (mtrl substitutes its failure reward).

    python examples/agents/search_agent/app.py --port 8080 --tools-url http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from strands_search import ToolService, openai_model, parse_task, run_episode
from bedrock_agentcore.runtime import BedrockAgentCoreApp

TRAJECTORY_HEADER = "X-Amzn-SageMaker-Trajectory-Id"

app = BedrockAgentCoreApp()
tools = ToolService(os.environ.get("MTRL_TOOLS_URL", "http://127.0.0.1:8001"), os.environ.get("MTRL_TOOLS_TOKEN"))


@app.entrypoint
async def invoke(payload: dict[str, Any]) -> dict[str, Any]:
    meta = payload["metadata"]
    trajectory_id = meta["trajectoryId"]
    base_url = meta["endpoint"].rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    params = dict(payload.get("inferenceParams") or {})
    model_id = params.pop("model", None) or "mtrl"
    # The trajectory id rides in the API-key (Bearer) slot and in the SageMaker header.
    model = openai_model(base_url, model_id, trajectory_id, params, {TRAJECTORY_HEADER: trajectory_id})
    return await run_episode(parse_task(payload["prompt"]), model, tools)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="mtrl search agent (strands + bedrock-agentcore)")
    p.add_argument("--host", default=os.environ.get("MTRL_AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("MTRL_AGENT_PORT", "8080")))
    p.add_argument("--tools-url", help="mtrl serve-tools (default: $MTRL_TOOLS_URL or http://127.0.0.1:8001)")
    a = p.parse_args()
    if a.tools_url:
        tools.url = a.tools_url.rstrip("/")
    app.run(port=a.port, host=a.host)
