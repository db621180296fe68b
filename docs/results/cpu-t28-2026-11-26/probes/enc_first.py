import time, sys, cProfile, pstats
from gpupipe.loader.encoded import EncodedLoader
enc = EncodedLoader(sys.argv[1], batch_size=64, num_workers=0, rank=0, world_size=1)
for e in range(3):
    p = cProfile.Profile(); w, c = time.perf_counter(), time.process_time()
    p.enable(); it = iter(enc); next(it); p.disable()
    print(f"pass {e}: first batch wall {1000*(time.perf_counter()-w):.1f} cpu {1000*(time.process_time()-c):.1f} ms")
    if e == 0: pstats.Stats(p).sort_stats("cumulative").print_stats(25)
    w, c = time.perf_counter(), time.process_time(); n = 1 + sum(1 for _ in it)
    print(f"   rest {n} batches wall {1000*(time.perf_counter()-w):.1f} cpu {1000*(time.process_time()-c):.1f}")
