#!/usr/bin/env bash
# Tests only: install the real torchvision the comparison tests run against, the release that
# matches the torch in use (torch 2.N pairs with torchvision 0.(N+15)), with --no-deps so that it
# never pulls another torch (a CUDA build, several GB) onto the machine, and into its own folder
# ($2), not the environment: only the pytest process puts it on sys.path (tests/tvshim.py), so
# `gpupipe fit`, the demo and Lightning never meet a torchvision whose C operators cannot load.
# Users are never pinned to it: the library itself does not import torchvision.
set -euo pipefail
PY="$1"
DEST="$2"
MINOR=$("$PY" -c "import torch; print(int(torch.__version__.split('.')[1]))")
VERSION="0.$((MINOR + 15))"
if ls "$DEST"/torchvision-"$VERSION".*.dist-info >/dev/null 2>&1; then
    exit 0
fi
rm -rf "$DEST"
exec "$PY" -m pip install -q --no-deps --no-compile --target "$DEST" "torchvision==$VERSION.*"
