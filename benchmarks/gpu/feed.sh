#!/usr/bin/env bash
# Issue 34's owed GPU checks (shared/GPU.md priority 1): gpupipe + DALI mixed against DALI's own
# pipeline and a 16-worker DataLoader, decode only and the simple set, with GPU utilisation and
# the training process's CPU per image outside the native decoder (bench prints "CPU us/img").
#
# Stage DALI + Kornia first (../shared/device/stage-gpu.sh, benchmarks/gpu/README.md) and the
# extras (braceexpand webdataset nvidia-ml-py) as for run_h200.sh. Then one call each:
#   bash benchmarks/gpu/feed.sh data     # 50,000 JPEGs 250x250 in 50 shards + the same in 5 shards (~3 min)
#   bash benchmarks/gpu/feed.sh bench    # both layouts: none + simple (128²), 16 workers        (~8 min)
#   bash benchmarks/gpu/feed.sh tiny     # 6,000 32x32 JPEGs, decode only, against DALI's pipeline (~2 min)
# Expected (write down before running): gpupipe >= 0.8 of DALI's own pipeline and >= 2x the
# DataLoader at 250² decode only; the training process <= 5 us/img outside the decoder.
set -euo pipefail
export PYTHONPATH=$HOME/gpsite:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
DATA=/tmp/gpupipe-feed
mkdir -p "$OUT" "$DATA"
PY=python3

case "${1:-}" in
data)
    timeout 400 $PY -m gpupipe.tools.bench.data paper --images 50000 --root "$DATA/paper-50000" --workers 16 \
        2>/dev/null | tee "$OUT/feed-data.txt"
    timeout 150 $PY -m gpupipe.tools.cli ingest "$DATA/paper-50000/images" "$DATA/paper-50000-5/shards" \
        --shard-size 10000 2>&1 | tail -2 | tee -a "$OUT/feed-data.txt"
    ;;
bench)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    for layout in paper-50000 paper-50000-5; do
        timeout 280 $PY -m gpupipe.tools.cli bench "$DATA/$layout/shards/" --augment none,simple --batch-size 256 \
            --image-size 128 --decode dali --device cuda --compare baseline,dali --workers 16 --repeat 3 --batches 40 \
            --images-dir "$DATA/paper-50000/images" --json "$OUT/feed-$layout.json" 2>&1 \
            | grep -v "Index file not provided" | tee "$OUT/feed-$layout.log"
    done
    ;;
tiny)
    timeout 200 $PY benchmarks/feed_bench.py --root "$DATA/tiny-6000" --rounds 5 --workers 0,1,4 --device cuda 2>&1 \
        | tee "$OUT/feed-tiny.txt"
    ;;
*)
    echo "usage: bash benchmarks/gpu/feed.sh data|bench|tiny" >&2
    exit 2
    ;;
esac
