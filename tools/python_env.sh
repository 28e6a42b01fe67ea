#!/usr/bin/env bash
# Makes the Python environment of the Hugging Face interoperability tests: a virtual environment
# (default build/pyenv, git-ignored) over Debian's python3 with its python3-torch (CPU), plus
# transformers and tokenizers from PyPI (a release that supports that torch). Installs only what is missing, so a second call takes a second; prints the
# environment's python on success. Exits non-zero, saying why, when it cannot be made (no
# python3-venv, no package registry).
# Usage: tools/python_env.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${1:-${TILEGRAD_PYENV:-build/pyenv}}"
PY="$ENV_DIR/bin/python"
probe='import torch, transformers, tokenizers, safetensors'
if [ -x "$PY" ] && "$PY" -c "$probe" >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi
# One install at a time (tests running in parallel may all ask for the environment).
mkdir -p "$(dirname "$ENV_DIR")"
exec 9>"$ENV_DIR.lock"
flock 9
if [ -x "$PY" ] && "$PY" -c "$probe" >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi
BASE="${TILEGRAD_PYTHON:-/usr/bin/python3}"
[ -x "$BASE" ] || BASE="$(command -v python3)"
# torch from Debian (~50 MB, CPU only; PyPI's Linux wheel pulls ~3 GB of CUDA libraries).
tools/install_deps.sh python3-torch python3-venv >&2
if [ ! -x "$PY" ]; then
  "$BASE" -m venv --system-site-packages "$ENV_DIR" >&2 || { echo "tilegrad: cannot create a virtual environment in $ENV_DIR (apt-get install python3-venv)" >&2; exit 1; }
fi
"$PY" -c 'import torch' >&2 || { echo "tilegrad: $BASE does not import torch (apt-get install python3-torch)" >&2; exit 1; }
echo "tilegrad: installing transformers and tokenizers into $ENV_DIR" >&2
# 4.46 is the last transformers release that supports Debian 12's torch 1.13; pip caches the wheels.
"$PY" -m pip install -q --disable-pip-version-check 'transformers>=4.40,<4.47' >&2 ||
  { echo "tilegrad: cannot install transformers (no package registry?)" >&2; exit 1; }
"$PY" -c "$probe" >&2 || { echo "tilegrad: the environment $ENV_DIR does not import torch and transformers" >&2; exit 1; }
echo "$PY"
