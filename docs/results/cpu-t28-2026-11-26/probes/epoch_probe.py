"""Per-epoch decode-only throughput of GpuLoader in a fresh process, vs the in-memory ceiling."""
import json, os, sys, time, statistics, cProfile, pstats, io, threading
import torch
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.loader.encoded import EncodedLoader
from gpupipe.loader.gpu import GpuLoader

shards, bs, side, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
workers = int(sys.argv[5]) if len(sys.argv) > 5 else 0
prof = os.environ.get("PROF")
size = (side, side)
cfg = DecodeConfig(backend="dali", image_size=size, num_threads=2)
t0 = time.perf_counter()
loader = GpuLoader(shards, batch_size=bs, image_size=size, device="cpu", decode=cfg, num_workers=workers, rank=0, world_size=1)
t_make = time.perf_counter() - t0
loader.timeline = []
profs = []
if prof:
    orig = loader._decode
    def wrapped(decoder, side_, enc):
        p = getattr(threading.current_thread(), "_prof", None)
        if p is None:
            p = threading.current_thread()._prof = cProfile.Profile(time.thread_time); profs.append(p)
        p.enable()
        try:
            return orig(decoder, side_, enc)
        finally:
            p.disable()
    loader._decode = wrapped
res = {"make_s": t_make, "epochs": []}
for e in range(epochs):
    n, firsts = 0, None
    c0, w0 = time.process_time(), time.perf_counter()
    for b in loader:
        if firsts is None:
            firsts = time.perf_counter() - w0
        n += len(b)
    w = time.perf_counter() - w0
    c = time.process_time() - c0
    spans = [(a - w0, b_ - a) for name, a, b_ in loader.timeline if name == "decode"]
    loader.timeline.clear()
    res["epochs"].append({"n": n, "img_s": n / w, "wall": w, "cpu": c, "first_batch_s": firsts,
                          "decode_ms": [round(d * 1000, 1) for _, d in spans[:6]],
                          "decode_median_ms": round(1000 * statistics.median(d for _, d in spans), 1)})
    if prof and profs:
        s = io.StringIO(); pstats.Stats(*profs, stream=s).sort_stats(os.environ.get("SORT","tottime")).print_stats(int(os.environ.get("NP","18")))
        res["epochs"][-1]["prof"] = s.getvalue()
        for p in profs: p.clear() if hasattr(p, "clear") else None
        profs.clear()
        for t in threading.enumerate():
            if hasattr(t, "_prof"): del t._prof
# ceiling: fresh decoder, in-memory batches
batches = list(EncodedLoader(shards, batch_size=bs, num_workers=0, rank=0, world_size=1))
dec = make_decoder(cfg, "cpu")
ceil = []
for r in range(epochs):
    w0 = time.perf_counter(); c0 = time.process_time()
    n = sum(len(dec.decode(b)) for b in batches)
    ceil.append({"img_s": n / (time.perf_counter() - w0), "cpu": time.process_time() - c0})
res["ceiling"] = ceil
res["load"] = os.getloadavg()
if prof:
    for e in res["epochs"]:
        print(f"--- epoch img/s {e['img_s']:.0f}\n", e.pop("prof"))
print(json.dumps(res))
