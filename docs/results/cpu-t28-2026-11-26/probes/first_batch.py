import time, sys, cProfile, pstats
from gpupipe.decode import DecodeConfig
from gpupipe.loader.gpu import GpuLoader
cfg = DecodeConfig(backend="dali", image_size=(128, 128), num_threads=2)
loader = GpuLoader(sys.argv[1], batch_size=64, image_size=(128, 128), device="cpu", decode=cfg, num_workers=0, rank=0, world_size=1)
enc = loader.encoded
for p in range(2):
    pr = cProfile.Profile(time.process_time); pr.enable()
    t, c = time.perf_counter(), time.process_time(); it = iter(enc); b = next(it)
    pr.disable()
    print(f"pass {p} first encoded batch wall {1000*(time.perf_counter()-t):.1f} cpu {1000*(time.process_time()-c):.1f}")
    if p == 0: pstats.Stats(pr).sort_stats("cumulative").print_stats(14)
    for _ in it: pass
dec = loader.decoder
t, c = time.perf_counter(), time.process_time(); dec.decode(b); print(f"first decode wall {1000*(time.perf_counter()-t):.1f} cpu {1000*(time.process_time()-c):.1f}")
t, c = time.perf_counter(), time.process_time(); dec.decode(b); print(f"second decode wall {1000*(time.perf_counter()-t):.1f} cpu {1000*(time.process_time()-c):.1f}")
