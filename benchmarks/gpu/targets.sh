#!/usr/bin/env bash
# Issue 27's owed GPU checks in one call (~5 min): boxes and masks on CUDA — the decode (nvjpeg; DALI
# mixed when its wheel is carried), the transforms, containers, policies and RandomIoUCrop against
# torchvision, GpuLoader's side stream with targets — then the detection pipeline against torchvision v2.
# Carry .gpuwheels/lite (and the DALI wheel for the dali cases). Results under $OUT.
export PYTHONPATH=$HOME/gpsite:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/gpsite" .gpuwheels/lite/*.whl 2>&1 | tail -2
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu --timeout 120 -rs \
  tests/decode/test_decode_targets.py tests/augment/test_targets_vs_torchvision.py \
  tests/augment/test_targets_policies.py tests/augment/test_ioucrop.py \
  2>&1 | tail -40 | tee "$OUT/pytest-gpu-targets.txt"
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/loader-targets-cuda.txt"
# GpuLoader on CUDA with targets: every box still sits on its own class in its own mask
import sys, tempfile, torch
sys.path.insert(0, "tests")
import gpupipe.transforms as T
from gpupipe.loader.gpu import GpuLoader
from gpupipe.tools.synth import write_detection_shards
root = tempfile.mkdtemp()
write_detection_shards(root, num_images=256, size=(96, 72), max_objects=1)
loader = GpuLoader(root, batch_size=32, num_workers=2, device="cuda", targets="boxes+masks", image_size=64,
                   resize="random_resized_crop", augment=[T.RandomHorizontalFlip(), T.RandomRotation(10),
                                                          T.SanitizeBoundingBoxes()])
bad = n = 0
for images, targets in loader:
    for t in targets:
        for (x1, y1, x2, y2), label in zip(t["boxes"].tolist(), t["labels"].tolist()):
            region = t["masks"][max(int(y1) - 1, 0):int(y2) + 2, max(int(x1) - 1, 0):int(x2) + 2]
            n += 1
            bad += not bool((region == label + 1).any())
print(f"cuda loader with targets: {n} boxes checked, {bad} off their masks; device {images.device}")
PY
timeout 200 python3 benchmarks/detection_bench.py --images 2048 --rounds 3 --workers 8 --device cuda 2>&1 | tail -6 \
  | tee "$OUT/detection-bench-cuda.txt"
