#!/usr/bin/env bash
# GPU.md calls 2-4 in one warm machine: DALI arrives in three pieces (.gpuwheels/p0 p1 p2, one per
# call: a call carries 64 MiB at most), and each call also does the checks that need no DALI.
#   bash benchmarks/gpu/chain.sh a   (carry .gpuwheels/p0 .gpuwheels/lite)  copy p0, install the lite wheels, make the data
#   bash benchmarks/gpu/chain.sh b   (carry .gpuwheels/p1)  copy p1, the no-DALI gpu tests, the memory probe (nvJPEG)
#   bash benchmarks/gpu/chain.sh c   (carry .gpuwheels/p2)  unpack DALI, the dali tests, the probe and bench with DALI
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$HOME/gpw"
LITE_TESTS="tests/decode/test_decode_contract.py tests/augment/test_augment_fused.py tests/augment/test_augment_geometry.py
  tests/augment/test_augment_color.py tests/decode/test_decoder_fuzz.py tests/loader/test_ranks_processes.py tests/decode/test_nvjpeg_upright.py"
case "$1" in
a)
  cp .gpuwheels/p0/* "$HOME/gpw/" && ls -la "$HOME/gpw"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$HOME/lite" .gpuwheels/lite/*.whl 2>&1 | tail -2
  export PYTHONPATH=$HOME/lite:$PWD
  timeout 60 python3 -m gpupipe.tools.cli bench --make-data paper --images 5000 --root /tmp/paper 2>&1 | tail -1 | tee "$OUT/data.txt"
  ;;
b)
  ls "$HOME/gpw/gpsite.tar.xz.0" /tmp/paper/shards >/dev/null || { echo "machine went cold: start again at a"; exit 3; }
  cp .gpuwheels/p1/* "$HOME/gpw/" && ls -la "$HOME/gpw"
  export PYTHONPATH=$HOME/lite:$PWD
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m "gpu and not dali" --timeout 60 -rs $LITE_TESTS 2>&1 \
    | tee "$OUT/pytest-lite.txt" | grep -E "^(FAILED|ERROR|E   .*Error|[0-9]+ (passed|failed))|passed|failed" | tail -40
  timeout 60 python3 benchmarks/gpu/lite_probe.py /tmp/paper/shards/ --passes 4 --out "$OUT/probe-nvjpeg.json" 2>&1 | tail -10
  ;;
c)
  ls "$HOME/gpw/gpsite.tar.xz.0" "$HOME/gpw/gpsite.tar.xz.1" >/dev/null || { echo "machine went cold: start again at a"; exit 3; }
  cat "$HOME"/gpw/gpsite.tar.xz.0 "$HOME"/gpw/gpsite.tar.xz.1 .gpuwheels/p2/* > "$HOME/gpsite.tar.xz"
  timeout 90 python3 -c "import tarfile, os; tarfile.open(os.path.expanduser('~/gpsite.tar.xz'), mode='r|xz').extractall(os.path.expanduser('~'), filter='data')"
  export PYTHONPATH=$HOME/gpsite:$PWD
  python3 -c "import nvidia.dali as d, kornia; print('dali', d.__version__, 'kornia', kornia.__version__)
try:
    import nvidia.nvimgcodec as n; print('nvimgcodec', n.__version__)
except Exception as e: print('nvimgcodec?', e)" 2>&1 | tee "$OUT/dali-env.txt"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m "dali" --timeout 150 -rs tests/decode/test_decode_contract.py \
    tests/decode/test_gpu_region_decode.py tests/decode/test_decoder_fuzz.py -s 2>&1 | tee "$OUT/pytest-dali.txt" \
    | grep -E "^(FAILED|ERROR)|AssertionError|Error:|nvimgcodec|DALI|version|passed|failed" | tail -40
  timeout 50 python3 benchmarks/gpu/lite_probe.py /tmp/paper/shards/ --decode dali --passes 3 --out "$OUT/probe-dali.json" 2>&1 | tail -8
  timeout 100 python3 -m gpupipe.tools.cli bench /tmp/paper/shards/ --augment none,simple --batch-size 256 --image-size 128 \
    --decode dali --device cuda --compare baseline,dali --workers 16 --repeat 2 --batches 15 --json "$OUT/bench-dali.json" \
    2>&1 | grep -v "Index file" | tail -12 | tee "$OUT/bench-dali.txt"
  ;;
esac
