import io, numpy as np
from PIL import Image
from nvidia.dali import fn, pipeline_def, types
from gpupipe.decode.pil import decode_one
rng = np.random.default_rng(0)
base = Image.open("/tmp/t28data/paper/images/" + __import__("os").listdir("/tmp/t28data/paper/images")[0] + "/" + "").__class__ if False else None
import glob
src = Image.open(sorted(glob.glob("/tmp/t28data/paper/images/*/*.jpg"))[0]).convert("RGB")
def enc(img, **kw):
    b = io.BytesIO(); img.save(b, "PNG", **kw); return b.getvalue()
a = np.asarray(src)
rgba = np.dstack([a, rng.integers(0, 256, a.shape[:2], dtype=np.uint8)])
cases = {
  "rgb8": enc(src), "rgb8_interlaced": enc(src, optimize=False) , "gray8": enc(src.convert("L")),
  "rgba8": enc(Image.fromarray(rgba, "RGBA")), "palette": enc(src.convert("P")),
  "la8": enc(src.convert("LA")), "gray16": enc(Image.fromarray((np.asarray(src.convert("L")).astype(np.uint16) * 257))),
  "rgb_gamma": None,
}
# interlaced: Pillow can't write Adam7; skip. gamma: add gAMA chunk by hand
import struct, zlib
def add_chunk(png, kind, data):
    c = struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return png[:33] + c + png[33:]
cases["rgb_gamma"] = add_chunk(cases["rgb8"], b"gAMA", struct.pack(">I", 100000))
cases["rgb_trns"] = add_chunk(cases["rgb8"], b"tRNS", struct.pack(">HHH", 0, 0, 0))
del cases["rgb8_interlaced"]
@pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
def p():
    e = fn.external_source(name="enc", dtype=types.DALIDataType.UINT8)
    return fn.decoders.image(e, device="cpu", output_type=types.DALIImageType.RGB, adjust_orientation=True)
pipe = p(); pipe.build()
for name, data in cases.items():
    ref = decode_one(data, None, None)
    try:
        pipe.feed_input("enc", [np.frombuffer(data, np.uint8)]); (o,) = pipe.run(); d = np.asarray(o[0])
        diff = np.abs(d.astype(int) - ref.astype(int)) if d.shape == ref.shape else None
        print(name, d.shape, d.dtype, "max diff", None if diff is None else diff.max(), "mean", None if diff is None else round(diff.mean(), 3))
    except Exception as e:
        print(name, "DALI error", str(e)[:100]); pipe = p(); pipe.build()
