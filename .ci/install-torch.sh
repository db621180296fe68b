#!/usr/bin/env bash
# Install torch into the given interpreter's environment without pulling CUDA
# builds onto a machine that has no NVIDIA GPU.
#   - torch already importable: nothing to do.
#   - an NVIDIA GPU (nvidia-smi works): the default build from the package index.
#   - no GPU: a locally provided wheel if pip's configured find-links has one
#     (then its dependencies from the index), else the PyTorch CPU-only index.
# TORCH_SPEC chooses the version (default: any).
set -euo pipefail
PY="$1"
SPEC="${TORCH_SPEC:-torch}"
if "$PY" -c "import torch" 2>/dev/null; then exit 0; fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    exec "$PY" -m pip install -q "$SPEC"
fi
if "$PY" -m pip install -q --no-index --no-deps "$SPEC" 2>/dev/null; then
    exec "$PY" -m pip install -q "$SPEC"
fi
exec "$PY" -m pip install -q "$SPEC" --index-url https://download.pytorch.org/whl/cpu
