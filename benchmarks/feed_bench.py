"""How close gpupipe's decode feed comes to DALI's own pipeline on the same shards (issue 34).

    python benchmarks/feed_bench.py --root .bench/tiny-6000 [--size 32] [--images 6000]
        [--workers 0,1] [--rounds 5] [--seconds 2] [--writer ingest|tarwriter] [--threads 2]
        [--code CHECKOUT ...]

Makes (once) ``--images`` dead-leaves JPEGs of ``--size``² px in shards of 1,000, written by
``gpupipe ingest`` or by webdataset's ``TarWriter`` (pax headers, then ``gpupipe index``), then
times, in rounds that alternate the loaders (each turn whole epochs for ``--seconds``; medians, so
the ratio holds on a noisy machine),
decode only, batch 256, shuffled, DALI's CPU decoder with ``--threads`` threads on both sides:

* gpupipe: ``GpuLoader(shards, decode="dali", device="cpu", resize="none")`` with 0 and 1 stream workers;
* DALI's own pipeline: ``fn.readers.webdataset`` → ``fn.decoders.image`` (prefetch 2);
* with ``--rows``, DALI's decoder alone fed padded rows made beforehand (:func:`rows_run`).

Beside images/s it prints the training process's CPU per sample outside the native decoder:
``utime + stime`` of this process's threads but DALI's own (named ``[DALI]...``), per sample
delivered (:func:`gpupipe.tools.bench.measure.thread_cpu`), and the workers' CPU apart.
With ``--code A B`` every turn is a fresh process (a loader, DALI's pipeline or the rows), gpupipe
imported from checkout ``A`` or ``B`` (``git worktree add /tmp/base REV``): two commits compared on
the same machine in the same minutes.
A benchmark, not a test: numbers go to docs/benchmarks.md with the command and the machine.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def make_data(root: str, images: int, size: int, writer: str) -> str:
    """``root/shards`` with ``images`` JPEGs of ``size``² px (made once)."""
    from gpupipe.formats.manifest import MANIFEST_NAME

    shards = os.path.join(root, "shards")
    if os.path.exists(os.path.join(shards, MANIFEST_NAME)):
        return shards
    from gpupipe.tools.synth import write_leaves_folder

    folder = os.path.join(root, "images")
    write_leaves_folder(folder, [(size, size)] * images, seed=0, quality=90, workers=os.cpu_count() or 1,
                        progress=False)
    if writer == "ingest":
        from gpupipe.prepare.ingest import ingest

        ingest(folder, shards, shard_size=1000, seed=0, progress=False)
        return shards
    import webdataset as wds

    from gpupipe.prepare.indexer import index

    files = sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))
    classes = sorted({os.path.basename(os.path.dirname(f)) for f in files})
    order = np.random.default_rng(0).permutation(len(files))
    os.makedirs(shards, exist_ok=True)
    for s in range(0, len(files), 1000):
        with wds.TarWriter(os.path.join(shards, f"shard-{s // 1000:05d}.tar")) as sink:
            for i in order[s:s + 1000].tolist():
                with open(files[i], "rb") as f:
                    data = f.read()
                sink.write({"__key__": f"{i:08d}", "jpg": data,
                            "cls": str(classes.index(os.path.basename(os.path.dirname(files[i])))).encode()})
    index(shards, progress=False)
    return shards


def gpupipe_run(shards: str, workers: int, threads: int, batch: int, device: str):
    from gpupipe import GpuLoader

    loader = GpuLoader(shards, batch_size=batch, decode="dali", device=device, num_threads=threads,
                       num_workers=workers, shuffle=True, drop_last=True)

    def run() -> int:
        n = 0
        for images, _ in loader:
            n += len(images)
        return n

    return run


def dali_run(shards: str, threads: int, batch: int, tmp: str, device: str):
    from nvidia.dali import fn, pipeline_def, types

    from gpupipe.tools.bench.dali import write_index

    files = sorted(glob.glob(os.path.join(shards, "*.tar")))
    index = write_index(files, tmp)
    import json

    with open(os.path.join(shards, "index.json")) as f:
        steps = sum(s["num_samples"] for s in json.load(f)["shards"]) // batch

    gpu = device.startswith("cuda")

    @pipeline_def(batch_size=batch, num_threads=threads, seed=0, prefetch_queue_depth=2,  # type: ignore[call-overload]
                  device_id=0 if gpu else None)
    def pipe():
        jpegs, _ = fn.readers.webdataset(paths=files, index_paths=index, ext=["jpg", "cls"], random_shuffle=True,
                                         initial_fill=1024, missing_component_behavior="skip", name="reader")
        return fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.DALIImageType.RGB)

    p = pipe()
    p.build()

    def run() -> int:
        n = 0
        for _ in range(steps):
            (out,) = p.run()
            n += len(out)
        return n

    return run


def shard_images(shards: str) -> list[np.ndarray]:
    """The JPEGs of the tar shards in folder ``shards``, in file order."""
    import tarfile

    images = []
    for path in sorted(glob.glob(os.path.join(shards, "*.tar"))):
        with tarfile.open(path) as tar:
            images += [np.frombuffer(tar.extractfile(m).read(), np.uint8)  # type: ignore[union-attr]
                       for m in tar.getmembers() if m.name.endswith((".jpg", ".jpeg"))]
    return images


def padded_batches(images: list[np.ndarray], batch: int) -> list[np.ndarray]:
    """``images`` as whole batches of padded (batch, longest) rows, as gpupipe feeds DALI."""
    batches = []
    for k in range(len(images) // batch):
        chunk = images[k * batch:(k + 1) * batch]
        rows = np.zeros((batch, max(len(d) for d in chunk)), np.uint8)
        for i, d in enumerate(chunk):
            rows[i, :len(d)] = d
        batches.append(rows)
    return batches


def rows_run(shards: str, threads: int, batch: int, device: str):
    """DALI's decoder alone, fed as gpupipe feeds it — each batch a padded (B, stride) array and
    two batches ahead — from batches made before the clock starts (the shards' JPEGs in file
    order): what the feed could reach with no stream and no hand-over at all."""
    from nvidia.dali import fn, pipeline_def, types

    images = shard_images(shards)
    batches = padded_batches(images, batch)
    gpu = device.startswith("cuda")

    @pipeline_def(batch_size=batch, num_threads=threads, prefetch_queue_depth=1,  # type: ignore[call-overload]
                  device_id=0 if gpu else None)
    def pipe():
        enc = fn.external_source(name="enc", dtype=types.DALIDataType.UINT8, no_copy=True)
        if gpu:  # cut to size on a GPU, as gpupipe does
            enc = fn.slice(enc, 0, fn.external_source(name="size", dtype=types.DALIDataType.INT32), axes=[0])
        return fn.decoders.image(enc, device="mixed" if gpu else "cpu", output_type=types.DALIImageType.RGB)

    p = pipe()
    p.build()
    sizes = [np.array([[len(d)] for d in images[k * batch:(k + 1) * batch]], np.int32) for k in range(len(batches))]

    def run() -> int:
        n, fed = 0, 0
        for rows, size in zip(batches, sizes):
            p.feed_input("enc", rows)
            if gpu:
                p.feed_input("size", size)
            p.schedule_run()
            fed += 1
            if fed > 2:
                p.outputs()
                fed, n = fed - 1, n + batch
        for _ in range(fed):
            p.outputs()
            n += batch
        return n

    return run


def timed(run, seconds: float) -> dict:
    """``run`` (one epoch) again until ``seconds`` have passed: an epoch of tiny images is ~0.1 s,
    where the CPU clock's 10 ms ticks and DALI's two batches run ahead during the other loader's
    turn (free at the start of its own) each moved a one-epoch round by ~10 %."""
    from gpupipe.tools.bench.measure import children_cpu, thread_cpu

    before, c0, t0 = thread_cpu(), children_cpu(), time.perf_counter()
    n = 0
    while not n or time.perf_counter() - t0 < seconds:
        n += run()
    wall, after, c1 = time.perf_counter() - t0, thread_cpu(), children_cpu()  # workers alive or done
    return {"img_s": n / wall, "outside_us": 1e6 * (after["outside"] - before["outside"]) / n,
            "native_us": 1e6 * (after["native"] - before["native"]) / n, "workers_us": 1e6 * (c1 - c0) / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=".bench/tiny-6000")
    ap.add_argument("--images", type=int, default=6000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--writer", choices=["ingest", "tarwriter"], default="ingest")
    ap.add_argument("--workers", default="0,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", action="store_true", help="also DALI's decoder alone, fed padded rows made beforehand "
                    "(rows_run: the feed's ceiling without a stream)")
    ap.add_argument("--seconds", type=float, default=2.0, help="each loader's turn in a round: whole epochs, at least this long")
    ap.add_argument("--device", default="cpu", help="cpu (DALI's CPU decoder on both sides) or cuda (mixed)")
    ap.add_argument("--code", nargs="+", metavar="CHECKOUT",
                    help="each turn a fresh process, gpupipe imported from each CHECKOUT in turn (two git worktrees: "
                         "an A/B of two commits on the same machine minutes apart), the order reversed every round")
    ap.add_argument("--child", choices=["dali", "rows", "gpupipe"], help=argparse.SUPPRESS)  # one turn, as JSON
    args = ap.parse_args(argv)
    shards = make_data(args.root, args.images, args.size, args.writer)
    if args.child:
        return child_turn(args, shards)
    if args.code:
        return fresh_rounds(args)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs["dali"] = dali_run(shards, args.threads, args.batch, tmp, args.device)
        if args.rows:
            runs["dali rows"] = rows_run(shards, args.threads, args.batch, args.device)
        for w in (int(v) for v in args.workers.split(",")):
            runs[f"gpupipe w={w}"] = gpupipe_run(shards, w, args.threads, args.batch, args.device)
        for run in runs.values():
            run()  # warm-up: builds, first touch
        results: dict[str, list[dict]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                results[name].append(timed(run, args.seconds))
    report(args, results)
    return 0


def child_turn(args, shards: str) -> int:
    """One loader's turn in this (fresh) process: warm up for a second, then :func:`timed`; JSON."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        if args.child == "dali":
            run = dali_run(shards, args.threads, args.batch, tmp, args.device)
        elif args.child == "rows":
            run = rows_run(shards, args.threads, args.batch, args.device)
        else:
            import gpupipe

            wanted = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
            if wanted and not os.path.abspath(gpupipe.__file__).startswith(os.path.abspath(wanted) + os.sep):
                raise SystemExit(f"gpupipe came from {gpupipe.__file__}, not from the checkout {wanted}")
            run = gpupipe_run(shards, int(args.workers), args.threads, args.batch, args.device)
        timed(run, 1.0)
        print(json.dumps(timed(run, args.seconds)))
    return 0


def fresh_rounds(args) -> int:
    """Each turn in a fresh process (:func:`child_turn`): DALI's pipeline, then every checkout
    with every worker count, in an order reversed every round."""
    import json
    import subprocess

    common = ["--root", args.root, "--images", str(args.images), "--size", str(args.size), "--writer", args.writer,
              "--threads", str(args.threads), "--batch", str(args.batch), "--seconds", str(args.seconds),
              "--device", args.device]
    turns = [("dali", ["--child", "dali"], None)] + ([("dali rows", ["--child", "rows"], None)] if args.rows else [])
    turns += [(f"{code} w={w}", ["--child", "gpupipe", "--workers", w], code)
              for w in args.workers.split(",") for code in args.code]
    results: dict[str, list[dict]] = {name: [] for name, _, _ in turns}
    for r in range(args.rounds):
        for name, extra, code in turns if r % 2 == 0 else turns[::-1]:
            env = dict(os.environ)
            if code is not None:
                env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(code), env.get("PYTHONPATH", "")])
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *common, *extra], env=env,
                                  capture_output=True, text=True, check=False)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if done.returncode or not lines:
                raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
            results[name].append(json.loads(lines[-1]))
        print(f"round {r}: " + ", ".join(f"{n} {rs[-1]['img_s']:.0f}" for n, rs in results.items()), flush=True)
    report(args, results)
    return 0


def report(args, results: dict[str, list[dict]]) -> None:
    dali = statistics.median(r["img_s"] for r in results["dali"])
    print(f"{args.images} JPEGs {args.size}x{args.size} ({args.writer}), batch {args.batch}, "
          f"{args.threads} DALI threads, {args.device}, median of {args.rounds}"
          + (", each turn a fresh process" if args.code else ""))
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        lo, hi = min(r["img_s"] for r in rs), max(r["img_s"] for r in rs)
        print(f"  {name:14s} {med['img_s']:9.0f} img/s ({lo:.0f}-{hi:.0f})  {med['img_s'] / dali:5.2f} of DALI   CPU us/sample: "
              f"outside native {med['outside_us']:6.1f}  native {med['native_us']:6.1f}  "
              f"workers {med['workers_us']:6.1f}")


if __name__ == "__main__":
    sys.exit(main())
