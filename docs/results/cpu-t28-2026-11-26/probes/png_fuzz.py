"""Mutated PNGs (CRCs fixed up, so they pass the plain-PNG check) through DALI's CPU decoder,
each batch in a child process: does anything kill the process?"""
import io, struct, subprocess, sys, zlib, glob, random
import numpy as np
CHILD = r"""
import sys, numpy as np
from nvidia.dali import fn, pipeline_def, types
datas = [np.frombuffer(open(p, 'rb').read(), np.uint8) for p in sys.argv[1:]]
@pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
def p():
    e = fn.external_source(name='enc', dtype=types.DALIDataType.UINT8)
    return fn.decoders.image(e, device='cpu', output_type=types.DALIImageType.RGB)
pipe = p(); pipe.build(); ok = bad = 0
for d in datas:
    try:
        pipe.feed_input('enc', [d]); pipe.run(); ok += 1
    except RuntimeError:
        bad += 1; pipe = p(); pipe.build()
print(ok, bad)
"""
def chunks(png):
    pos, out = 8, []
    while pos < len(png):
        n, k = struct.unpack_from(">I4s", png, pos); out.append([k, bytearray(png[pos + 8:pos + 8 + n])]); pos += 12 + n
    return out
def build(cs):
    return b"\x89PNG\r\n\x1a\n" + b"".join(struct.pack(">I", len(d)) + k + bytes(d) + struct.pack(">I", zlib.crc32(k + bytes(d))) for k, d in cs)
rng = random.Random(0)
srcs = [open(f, "rb").read() for f in sorted(glob.glob("/tmp/t28data/png/images/*/*.png"))[:40]]
import tempfile, os
tmp = tempfile.mkdtemp()
paths = []
for i in range(int(sys.argv[1])):
    cs = chunks(rng.choice(srcs))
    kind = rng.choice(["flip", "zero", "trunc_idat", "ihdr_size", "zlib_hdr", "adler", "filter"])
    idat = [c for c in cs if c[0] == b"IDAT"]
    d = idat[0][1]
    if kind == "flip":
        for _ in range(rng.randint(1, 20)): j = rng.randrange(len(d)); d[j] ^= 1 << rng.randrange(8)
    elif kind == "zero":
        j = rng.randrange(len(d)); d[j:j + rng.randint(1, 500)] = bytes(min(500, len(d) - j))
    elif kind == "trunc_idat":
        del d[rng.randrange(len(d)):]; cs = [c for c in cs if c[0] != b"IDAT" or c is idat[0]]
    elif kind == "ihdr_size":
        w, h = struct.unpack_from(">II", cs[0][1]); struct.pack_into(">II", cs[0][1], 0, w + rng.randint(-50, 400), h + rng.randint(-50, 400))
    elif kind == "zlib_hdr":
        d[0] = rng.randrange(256); d[1] = rng.randrange(256)
    elif kind == "adler":
        last = idat[-1][1]; last[-1] ^= 0xFF
    elif kind == "filter":
        j = 2 + rng.randrange(len(d) - 2); d[j] = rng.choice([5, 6, 200, 255])
    p = os.path.join(tmp, f"{i}.png"); open(p, "wb").write(build(cs)); paths.append(p)
deaths = 0
for k in range(0, len(paths), 50):
    r = subprocess.run([sys.executable, "-c", CHILD, *paths[k:k + 50]], capture_output=True, text=True)
    if r.returncode != 0:
        deaths += 1; print("DIED", r.returncode, r.stderr[-300:])
    else:
        print("ok/refused", r.stdout.strip())
print("children died:", deaths, "of", (len(paths) + 49) // 50)
