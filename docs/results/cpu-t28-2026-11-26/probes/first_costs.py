import time, sys, resource
def ru(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_minflt
T = lambda: (time.perf_counter(), time.process_time(), ru())
def d(a, b): return f"wall {1000*(b[0]-a[0]):7.1f} ms cpu {1000*(b[1]-a[1]):7.1f} ms minflt {b[2]-a[2]:6d}"
shards = sys.argv[1]
from gpupipe.decode import DecodeConfig
from gpupipe.loader.gpu import GpuLoader
cfg = DecodeConfig(backend="dali", image_size=(128, 128), num_threads=2)
t = T(); loader = GpuLoader(shards, batch_size=64, image_size=(128, 128), device="cpu", decode=cfg, num_workers=0, rank=0, world_size=1); print("make", d(t, T()))
enc = loader.encoded
for p in range(2):
    t = T(); bs = list(enc); print(f"encoded pass {p}", d(t, T()))
dec = loader.decoder
for p in range(3):
    t = T(); x = dec.decode(bs[0]); print(f"decode batch 0, time {p}", d(t, T()))
for p in range(2):
    t = T()
    for b in bs[1:]: dec.decode(b)
    print(f"decode rest, pass {p}", d(t, T()))
