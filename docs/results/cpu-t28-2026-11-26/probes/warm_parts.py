import time, sys, os
T = lambda: (time.perf_counter(), time.process_time())
def d(a, b): return f"wall {1000*(b[0]-a[0]):7.1f} ms cpu {1000*(b[1]-a[1]):7.1f} ms"
shards = sys.argv[1]
t = T()
import torch
from gpupipe.decode import DecodeConfig, make_decoder
from gpupipe.loader.encoded import EncodedLoader
t1 = T(); print("import torch+gpupipe", d(t, t1))
enc = EncodedLoader(shards, batch_size=64, num_workers=0, rank=0, world_size=1)
t2 = T(); print("EncodedLoader()", d(t1, t2))
it = iter(enc.batches()) if hasattr(enc, "batches") else iter(enc)
b0 = next(iter(enc)); t3 = T(); print("first encoded batch", d(t2, t3))
batches = [b0] + [b for _, b in zip(range(5), iter(enc))]
t3 = T()
import nvidia.dali
t4 = T(); print("import nvidia.dali", d(t3, t4))
from nvidia.dali import fn, pipeline_def, types
cfg = DecodeConfig(backend="dali", image_size=(128, 128), num_threads=2)
dec = make_decoder(cfg, "cpu")
t5 = T(); print("make_decoder", d(t4, t5))
pipe = dec._build(64, False)
t6 = T(); print("_build(64)", d(t5, t6)); dec._pipes[(False, False)] = (pipe, 64)
for i, b in enumerate(batches):
    a = T(); dec.decode(b); z = T(); print(f"decode batch {i}", d(a, z))
for i, b in enumerate(batches[:3]):
    a = T(); dec.decode(b); z = T(); print(f"decode again {i}", d(a, z))
