#!/usr/bin/env bash
# The test command of the README and of .ci/run: fetch the real embedder weights once (they are
# not in git), then run the whole workspace test suite. Tests need no network after this step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-embedder.sh
cargo test --workspace "$@"
