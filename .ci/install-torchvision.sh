#!/usr/bin/env bash
# Tests only: install the real torchvision the comparison tests run against (tests/tvshim.py),
# the release that matches the torch in use (torch 2.N pairs with torchvision 0.(N+15)), with
# --no-deps so that it never pulls another torch (a CUDA build, several GB) onto the machine.
# Users are never pinned to it: the library itself does not import torchvision.
set -euo pipefail
PY="$1"
MINOR=$("$PY" -c "import torch; print(int(torch.__version__.split('.')[1]))")
SPEC="torchvision==0.$((MINOR + 15)).*"
if "$PY" -c "import importlib.metadata as m, sys; v = m.version('torchvision'); sys.exit(0 if v.startswith('0.$((MINOR + 15)).') else 1)" 2>/dev/null; then
    exit 0
fi
exec "$PY" -m pip install -q --no-deps "$SPEC"
