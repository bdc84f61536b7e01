#!/usr/bin/env python3
"""The search agent as an agentcore-rl-toolkit `AgentCoreRLApp` with `@app.rollout_entrypoint`
(the toolkit's original API, still what its examples use).

`POST /invocations` with the task payload plus `_rollout` {base_url, model_id, api_key,
sampling_params?, exp_id, input_id, s3_bucket}. The call answers at once, `{"status":
"processing", "s3_bucket": …, "result_key": "<exp_id>/<input_id>/<session id>.json"}`; the
episode runs in the background and its result dict is written to that S3 object (with
`status_code`, `stop_reason`, `input_id`, `s3_bucket`, `result_key`, `payload` added). Without
`exp_id`/`input_id`/`s3_bucket` nothing is saved and the result is lost, so a local run needs an
S3 endpoint: boto3 honours `AWS_ENDPOINT_URL_S3` (path-style `PUT <endpoint>/<bucket>/<key>`).

    AWS_ENDPOINT_URL_S3=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \
      python examples/agents/toolkit_agent/rl_app.py --port 8080
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from rollout import rollout, tools

app = AgentCoreRLApp()


@app.rollout_entrypoint
async def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    result = await rollout(payload)
    if "reward" in result:  # the toolkit's S3 readers take `rewards` (a scalar, or a list: last wins)
        result["rewards"] = result.pop("reward")
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="mtrl search agent (agentcore-rl-toolkit rollout_entrypoint)")
    p.add_argument("--host", default=os.environ.get("MTRL_AGENT_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("MTRL_AGENT_PORT", "8080")))
    p.add_argument("--tools-url", help="mtrl serve-tools (default: $MTRL_TOOLS_URL or http://127.0.0.1:8001)")
    a = p.parse_args()
    if a.tools_url:
        tools.url = a.tools_url.rstrip("/")
    app.run(port=a.port, host=a.host)
