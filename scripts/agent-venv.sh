#!/usr/bin/env bash
# The Python environment of the example agents (examples/agents/) and of the tests that run them
# against `mtrl serve` / `mtrl serve-tools`: the official `openai` client, `strands-agents`,
# `bedrock-agentcore` and `agentcore-rl-toolkit`, at pinned versions, from the Python package
# registry.
#
#   scripts/agent-venv.sh                 # installs once, prints the venv's python path
#   PY="$(scripts/agent-venv.sh)"; "$PY" examples/agents/plain_agent.py --port 0
#   scripts/agent-venv.sh --no-install    # prints the path, or exits 3 when it is not installed
#   scripts/agent-venv.sh --pins          # prints the pin list
#
# Only stdout carries the path; progress goes to stderr. The venv lives in
# ${MTRL_AGENT_VENV:-$HOME/.cache/mtrl/agent-venv} and is keyed by a hash of the pin list and the
# interpreter's version: a pin change rebuilds it, otherwise it is reused without the network
# (tests call it with --no-install so that they never reach the network). Interpreter:
# ${MTRL_PYTHON:-python3}, 3.11 or newer (agentcore-rl-toolkit's floor).
set -euo pipefail

venv="${MTRL_AGENT_VENV:-$HOME/.cache/mtrl/agent-venv}"
python="${MTRL_PYTHON:-python3}"

# The four packages the examples import (no extras: the minimal installs they need) ...
PINS="
openai==3.57.0
strands-agents==1.62.0
bedrock-agentcore==1.25.0
agentcore-rl-toolkit==0.2.0
"
# ... and everything they pull in, as resolved on Python 3.11 (pip freeze), as constraints.
LOCK="
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
boto3==1.44.8
botocore==1.44.8
certifi==2026.10.19.post1
cffi==2.1.1
click==8.5.1
cryptography==50.0.2
docstring_parser==0.18.0
h11==0.16.0
httpcore==1.0.9
httpcore2==2.16.2
httpx==0.28.1
httpx2==2.16.2
idna==3.20
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
mcp==2.1.1
mcp-types==2.1.1
opentelemetry-api==1.45.1
opentelemetry-instrumentation==0.66b1
opentelemetry-instrumentation-threading==0.66b1
opentelemetry-sdk==1.45.1
opentelemetry-semantic-conventions==0.66b1
packaging==26.4
pycparser==3.12
pydantic==2.14.4
pydantic_core==2.50.5
PyJWT==2.15.1
python-dateutil==2.9.0.post0
python-multipart==0.0.34
PyYAML==6.0.4
referencing==0.37.0
rpds-py==2026.9.1
s3transfer==0.19.3
six==1.17.0
sniffio==1.3.1
sse-starlette==3.7.0
starlette==1.10.0
truststore==0.10.5
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
uvicorn==0.54.0
watchdog==6.0.0
websockets==17.4
wrapt==2.5.2
"

log() { echo "agent-venv: $*" >&2; }

key() {
  local version
  version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  printf '%s\n%s\npython %s\n' "$PINS" "$LOCK" "$version" | sha256sum | cut -c1-16
}

installed() {
  [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.mtrl-agent-pins" 2>/dev/null)" = "$(key)" ]
}

install() {
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    log "$python is missing or older than 3.11 (set MTRL_PYTHON)"
    exit 2
  fi
  mkdir -p "$(dirname "$venv")"
  # One installer at a time (tests may start in parallel); the others wait, then reuse.
  exec 9>"$venv.lock"
  flock 9
  if installed; then
    return 0
  fi
  log "installing the agent packages into $venv (Python package registry; about a minute the first time)"
  local t0=$SECONDS
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # shellcheck disable=SC2086  # one argument per pin
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -c <(echo "$LOCK") $PINS >&2
  key >"$venv/.mtrl-agent-pins"
  log "installed in $((SECONDS - t0)) s ($(du -sh "$venv" | cut -f1))"
}

case "${1:-}" in
  "") installed || install ;;
  --no-install)
    if ! installed; then
      log "not installed (or the pins changed) in $venv: run scripts/agent-venv.sh"
      exit 3
    fi
    ;;
  --pins) echo "$PINS" | sed '/^$/d'; exit 0 ;;
  *)
    echo "usage: $0 [--no-install | --pins]" >&2
    exit 2
    ;;
esac
echo "$venv/bin/python"
