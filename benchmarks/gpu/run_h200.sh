#!/usr/bin/env bash
# Issue 6 on the lent H200: gpupipe vs torch DataLoader (16 workers), webdataset and pure DALI
# (mixed), on the paper setup (50,000 JPEGs at 250x250) and the ImageNet size mix, for the
# simple and complex sets (and none: decode only). Results (JSON, PNG, logs) go under $OUT.
#
# Before: stage DALI + Kornia (../shared/GPU.md), and the pure-Python extras the H200 lacks:
#   python3 -m pip download -q --no-deps -d .gpuwheels/extra braceexpand webdataset nvidia-ml-py
# then, in the same warm machine, in one call each (every call must finish within 10 minutes):
#   bash benchmarks/gpu/run_h200.sh setup      # install the extras, check CUDA/DALI/Kornia   (~1 min)
#   bash benchmarks/gpu/run_h200.sh paper      # make 50,000 x 250x250 + bench                 (~9 min)
#   bash benchmarks/gpu/run_h200.sh imagenet   # make 20,000 ImageNet-mix + bench              (~9 min)
# Data lives in /tmp/gpupipe-bench: if the machine went cold between calls, the next call remakes it
# (same seed, same bytes). The plots need matplotlib; if it is missing there, draw them here with
#   .venv/bin/python -m gpupipe.tools.bench.plot <json> -o docs/bench-h200-<name>.png
set -euo pipefail
export PYTHONPATH=$HOME/gpsite:$PWD
OUT=${OUT:-/tmp/out}
DATA=/tmp/gpupipe-bench
mkdir -p "$OUT" "$DATA"
PY=python3

plot_flag() {  # --plot only where matplotlib imports
    if $PY -c "import matplotlib" 2>/dev/null; then echo "--plot $OUT/bench-h200-$1.png"; fi
}

bench() {  # name, data root, sets, batch size, image size, extra args...
    local name=$1 root=$2 sets=$3 batch=$4 size=$5; shift 5
    $PY -m gpupipe.tools.cli bench "$root/shards/" --augment "$sets" --batch-size "$batch" --image-size "$size" \
        --decode dali --device cuda --compare baseline,webdataset,dali --workers 4,16 --repeat 3 "$@" \
        --json "$OUT/bench-h200-$name.json" $(plot_flag "$name") 2>&1 | grep -v "Index file not provided" \
        | tee "$OUT/bench-h200-$name.log"
}

case "${1:-}" in
setup)
    $PY -m pip install -q --no-deps --target "$HOME/gpsite" .gpuwheels/extra/*.whl
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    $PY -c "import torch, nvidia.dali, kornia, webdataset, torchvision, pynvml; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'dali', nvidia.dali.__version__, 'kornia', kornia.__version__, 'torchvision', torchvision.__version__, 'util', torch.cuda.utilization())" | tee "$OUT/versions.txt"
    ;;
paper)
    $PY -m gpupipe.tools.bench.data paper --images 50000 --root "$DATA/paper-50000" --workers 16 2>/dev/null | tee "$OUT/data-paper.txt"
    # 60 timed batches of 256 per run (15,360 images); the docs' sizes: simple 128x128, complex 256x256
    bench paper-simple "$DATA/paper-50000" none,simple 256 128 --batches 60
    bench paper-complex "$DATA/paper-50000" complex 256 256 --batches 40
    ;;
imagenet)
    $PY -m gpupipe.tools.bench.data imagenet --images 20000 --root "$DATA/imagenet-20000" --workers 16 2>/dev/null | tee "$OUT/data-imagenet.txt"
    bench imagenet "$DATA/imagenet-20000" none,simple,complex 256 224 --batches 30
    ;;
*)
    echo "usage: bash benchmarks/gpu/run_h200.sh setup|paper|imagenet" >&2
    exit 2
    ;;
esac
