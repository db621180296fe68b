#!/usr/bin/env bash
# GPU.md call 1 ("lite"): every GPU check that needs no DALI, in one command on the lent machine.
# Carry .gpuwheels/lite (Kornia, braceexpand, webdataset wheels). Results under $OUT.
export PYTHONPATH=$HOME/gpsite:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/gpsite" .gpuwheels/lite/*.whl 2>&1 | tail -2
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import torch, torchvision, kornia, lightning, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'torchvision', torchvision.__version__, 'kornia', kornia.__version__, 'lightning', lightning.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m "gpu and not dali" -x --timeout 120 -rs \
  tests/decode/test_decode_contract.py tests/augment/test_augment_fused.py tests/augment/test_augment_geometry.py \
  tests/augment/test_augment_color.py tests/decode/test_decoder_fuzz.py tests/loader/test_ranks_processes.py \
  2>&1 | tail -40 | tee "$OUT/pytest-gpu-lite.txt"
timeout 75 python3 -m gpupipe.tools.cli bench --make-data paper --images 5000 --root /tmp/paper 2>&1 | tail -3 | tee "$OUT/data.txt"
timeout 90 python3 benchmarks/gpu/lite_probe.py /tmp/paper/shards/ --passes 4 --out "$OUT/probe.json" 2>&1 | tail -12
timeout 60 python3 benchmarks/augment_bench.py --device cuda --no-sequential --repeat 5 --out "$OUT/augment-cuda.json" 2>&1 | tail -12 | tee "$OUT/augment-cuda.txt"
timeout 150 python3 -m gpupipe.tools.cli bench /tmp/paper/shards/ --augment none,simple --batch-size 256 --image-size 128 \
  --decode nvjpeg --device cuda --compare baseline --workers 16 --repeat 2 --batches 25 --json "$OUT/bench-nvjpeg.json" \
  2>&1 | tail -25 | tee "$OUT/bench-nvjpeg.txt"
