"""PNG decode options on the CPU (issue 28): images/s and process CPU ms per image, 1 and 2
threads, on the first 512 PNGs of a folder (``benchmarks/png_data.py`` makes one):

    .venv/bin/python benchmarks/png_probe.py /tmp/t28data/png/images

Pillow decode + resize (what the Pillow backend and the DataLoader baseline do), Pillow decode
alone, Pillow decode + torch's uint8 resize, and DALI's CPU decoder (``fn.decoders.image``,
batches of 64), which is also checked for Pillow's pixels. Medians of 3 rounds after one. Not a test.
"""
import glob
import io
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

files = sorted(glob.glob(sys.argv[1] + "/*/*.png"))[:512]
datas = [open(f, "rb").read() for f in files]
size = (128, 128)
def pil_full(d):
    with Image.open(io.BytesIO(d)) as im:
        im = im.convert("RGB")
        return np.asarray(im.resize((128, 128), Image.BILINEAR))
def pil_decode(d):
    with Image.open(io.BytesIO(d)) as im:
        im.load()
        return np.asarray(im.convert("RGB") if im.mode != "RGB" else im)
def torch_resize(a):
    t = torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None]
    return F.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)
torch.set_num_threads(1)
def timeit(name, fn, threads):
    res = []
    for _r in range(4):
        w, c = time.perf_counter(), time.process_time()
        if threads == 1:
            for d in datas: fn(d)
        else:
            with ThreadPoolExecutor(threads) as ex: list(ex.map(fn, datas, chunksize=8))
        res.append((len(datas) / (time.perf_counter() - w), 1000 * (time.process_time() - c) / len(datas)))
    res = res[1:]
    print(f"{name:<34} t={threads}: {statistics.median(r[0] for r in res):7.0f} img/s  cpu {statistics.median(r[1] for r in res):.3f} ms/img")
for t in (1, 2):
    timeit("pillow decode+resize", pil_full, t)
    timeit("pillow decode only", pil_decode, t)
    timeit("pillow decode + torch resize", lambda d: torch_resize(pil_decode(d)), t)
# DALI
from nvidia.dali import fn, pipeline_def, types

for threads in (1, 2):
    @pipeline_def(batch_size=64, num_threads=threads, prefetch_queue_depth=1, device_id=None)
    def p():
        enc = fn.external_source(name="enc", dtype=types.DALIDataType.UINT8)
        return fn.decoders.image(enc, device="cpu", output_type=types.DALIImageType.RGB)
    pipe = p(); pipe.build()
    arrs = [np.frombuffer(d, np.uint8) for d in datas]
    res = []
    for _r in range(4):
        w, c = time.perf_counter(), time.process_time()
        for i in range(0, len(arrs), 64):
            pipe.feed_input("enc", arrs[i:i + 64]); (out,) = pipe.run()
        res.append((len(arrs) / (time.perf_counter() - w), 1000 * (time.process_time() - c) / len(arrs)))
    res = res[1:]
    ok = np.array_equal(np.asarray(out[0]), pil_decode(datas[len(arrs) - 64]))
    print(f"{'dali cpu decode only':<34} t={threads}: {statistics.median(r[0] for r in res):7.0f} img/s  cpu {statistics.median(r[1] for r in res):.3f} ms/img  same pixels as pillow: {ok}")
