#!/usr/bin/env bash
# A throw-away MLflow tracking server on loopback, for the MLflow integration test (tests/mlflow.rs)
# and for trying `[logging] mlflow = …` by hand.
#
#   scripts/mlflow-server.sh install              # venv with mlflow from the Python package registry (once)
#   eval "$(scripts/mlflow-server.sh start)"      # prints MTRL_MLFLOW_URI=… and MTRL_MLFLOW_DIR=…
#   scripts/mlflow-server.sh stop "$MTRL_MLFLOW_DIR"
#   scripts/mlflow-server.sh start --no-install --owner-pid PID   # stops by itself when PID exits
#
# `start` installs first unless given --no-install (then a missing venv is an error: tests use that
# so that they never reach the network). The server gets a free port on 127.0.0.1, a SQLite backend
# store and an artifact folder in a fresh temp dir (removed by `stop`), serves artifacts through
# its mlflow-artifacts proxy, and is ready (`/health` answers) when `start` returns.
# The venv lives in ${MTRL_VENV_DIR:-$HOME/.cache/mtrl}/mlflow-venv and is reused when present.
set -euo pipefail

MLFLOW_VERSION="${MTRL_MLFLOW_VERSION:-3.17.2}"
venv="${MTRL_VENV_DIR:-$HOME/.cache/mtrl}/mlflow-venv"
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

log() { echo "mlflow-server: $*" >&2; }

installed() {
  [ -x "$venv/bin/mlflow" ] && [ "$(cat "$venv/.mtrl-mlflow-version" 2>/dev/null)" = "$MLFLOW_VERSION" ]
}

install() {
  if installed; then
    log "mlflow $MLFLOW_VERSION already installed in $venv"
    return 0
  fi
  log "installing mlflow==$MLFLOW_VERSION into $venv (Python package registry; a few minutes the first time)"
  local t0=$SECONDS
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "mlflow==$MLFLOW_VERSION" >&2
  echo "$MLFLOW_VERSION" >"$venv/.mtrl-mlflow-version"
  log "installed in $((SECONDS - t0)) s"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local no_install=0 owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-install) no_install=1 ;;
      --owner-pid) owner="${2:?--owner-pid needs a pid}"; shift ;;
      *) log "unknown option $1"; exit 2 ;;
    esac
    shift
  done
  if ! installed; then
    if [ "$no_install" = 1 ]; then
      log "mlflow is not installed in $venv: run scripts/mlflow-server.sh install (or scripts/test.sh)"
      exit 3
    fi
    install
  fi
  local dir port url pid t0=$SECONDS
  dir="$(mktemp -d "${TMPDIR:-/tmp}/mtrl-mlflow.XXXXXX")"
  port="$(free_port)"
  url="http://127.0.0.1:$port"
  # setsid: the server and its workers get their own process group, so `stop` ends exactly them.
  # No background job runner (MLflow 3's huey workers: a dozen processes a tracking test never
  # uses, and seconds of start-up on a 2-core machine).
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    setsid "$venv/bin/mlflow" server --host 127.0.0.1 --port "$port" --workers 1 \
      --backend-store-uri "sqlite:///$dir/mlflow.db" --artifacts-destination "$dir/artifacts" \
    >"$dir/server.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  echo "$url" >"$dir/url"
  for _ in $(seq 1 240); do
    if curl -fsS "$url/health" >/dev/null 2>&1; then
      log "server $url ready in $((SECONDS - t0)) s (pid $pid, state in $dir)"
      if [ -n "$owner" ]; then
        # Stop the server once the process that asked for it is gone (a test binary has no
        # teardown hook); detached, silent.
        setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" stop "$3"' \
          _ "$owner" "$self" "$dir" >/dev/null 2>&1 </dev/null &
      fi
      echo "MTRL_MLFLOW_URI=$url"
      echo "MTRL_MLFLOW_DIR=$dir"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server exited before it was ready; its log:"
      cat "$dir/server.log" >&2
      rm -rf "$dir"
      exit 1
    fi
    sleep 0.5
  done
  log "server not ready after 120 s; its log:"
  tail -n 50 "$dir/server.log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir="${1:-}"
  if [ -z "$dir" ] || [ ! -f "$dir/pid" ]; then
    log "stop: give the MTRL_MLFLOW_DIR that start printed"
    exit 2
  fi
  local pid
  pid="$(cat "$dir/pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
  log "stopped (pid $pid)"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  install) install ;;
  start) start "$@" ;;
  stop) stop "$@" ;;
  *)
    echo "usage: $0 install | start [--no-install] [--owner-pid PID] | stop MTRL_MLFLOW_DIR" >&2
    exit 2
    ;;
esac
