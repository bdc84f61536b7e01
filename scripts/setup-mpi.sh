#!/usr/bin/env bash
# Makes sure Open MPI and what the `mpi` feature builds with are installed: `mpirun`/`mpicc` and
# the headers (Debian: openmpi-bin libopenmpi-dev) and libclang (the bindings are generated at
# build time). Installs them with apt when missing (as root, or with sudo); elsewhere it says what
# to install. Idempotent: a machine that has them only pays the checks.
set -euo pipefail

need=()
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "[setup-mpi] installing ${need[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[setup-mpi] no apt-get here: install Open MPI with its headers (mpicc) and libclang" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
command -v mpirun >/dev/null && command -v mpicc >/dev/null
