#!/usr/bin/env bash
# The test command of the README and of .ci/run: install Open MPI when missing, fetch the real embedder weights and the
# real Qwen2.5-Coder-0.5B GGUF once (they are not in git), install the agent venv once, install MLflow once and start a throw-away tracking server on loopback for
# tests/mlflow.rs (stopped on exit), then run the whole workspace test suite. Tests need no
# network after these steps.
set -euo pipefail
cd "$(dirname "$0")/.."
# Open MPI for the data-parallel tests (tests/mpi_train.rs runs real `mpirun`).
scripts/setup-mpi.sh
scripts/fetch-embedder.sh
# The real Qwen2.5-Coder-0.5B-Instruct GGUF (491 MB, once per machine) for tests/real_qwen.rs.
scripts/fetch-qwen.sh >/dev/null
# The pinned Python client stack of the agent tests (openai, strands-agents, bedrock-agentcore,
# agentcore-rl-toolkit), installed once into a cached venv.
MTRL_AGENT_PYTHON="$(scripts/agent-venv.sh)"
export MTRL_AGENT_PYTHON
if [ -z "${MTRL_TEST_MLFLOW_URI:-}" ]; then
  mlflow_env="$(scripts/mlflow-server.sh start)"
  MTRL_TEST_MLFLOW_URI="$(sed -n 's/^MTRL_MLFLOW_URI=//p' <<<"$mlflow_env")"
  mlflow_dir="$(sed -n 's/^MTRL_MLFLOW_DIR=//p' <<<"$mlflow_env")"
  export MTRL_TEST_MLFLOW_URI
  trap 'scripts/mlflow-server.sh stop "$mlflow_dir"' EXIT
fi
# Open MPI's runtime inside containers: no cross-memory attach, and root allowed.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo test --workspace --features mtrl/mpi "$@"
