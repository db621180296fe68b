"""The Lightning example again, reading the shards from S3 (a local moto server).

What it shows: the pipeline is the same; only ``source`` changes — ``s3://`` URLs and
``storage_options`` with an ``endpoint_url`` (MinIO, Ceph, R2 or a test server alike) and
credentials, which gpupipe never prints. Here moto's ``ThreadedMotoServer`` runs in this
process on 127.0.0.1 (nothing leaves the machine); the shards are written locally and
uploaded with s3fs, then streamed back by byte ranges using their ``index.json``.
With real S3, drop the server and set ``storage_options`` (or the usual AWS variables).

Needs ``moto[server]`` and ``s3fs`` (``pip install 'gpupipe[s3]' 'moto[server]'``). Run::

    python examples/train_lightning_s3.py            # 2 epochs of 512 images
    python examples/train_lightning_s3.py --fast     # under a minute on a laptop CPU
"""
from __future__ import annotations

import argparse
import os
import tempfile

from _shards import colour_shards
from train_lightning_local import pipeline, train

BUCKET = "gpupipe-example"
CREDENTIALS = {"key": "testing", "secret": "testing"}  # moto accepts any


def start_s3() -> tuple[object, str]:
    """moto's S3 on a free loopback port; (server, endpoint URL)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def upload(local: str, url: str, storage_options: dict) -> None:
    """Copy a folder of shards (and its index.json) to ``url``."""
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options)
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    fs.put(local.rstrip("/") + "/", url.rstrip("/") + "/", recursive=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true", help="small data, one epoch, no worker processes")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    images, epochs = (192, 1) if args.fast else (args.images, args.epochs)
    server, endpoint = start_s3()
    options = {"endpoint_url": endpoint, **CREDENTIALS}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for split, n, seed in (("train", images, 0), ("val", max(32, images // 8), 1)):
                upload(colour_shards(os.path.join(tmp, split), n, seed=seed), f"s3://{BUCKET}/{split}/", options)
            from gpupipe.config.schema import load_config

            config = load_config(pipeline(f"s3://{BUCKET}/train/", f"s3://{BUCKET}/val/",
                                          workers=0 if args.fast else 2, storage_options=options))
            print(f"streaming from {endpoint}; config storage options: {config.source.storage_options}")
            before, after = train(config, epochs=epochs, root=tmp, fast=args.fast)
    finally:
        server.stop()
    print(f"trained {epochs} epoch(s) on {images} images from s3://{BUCKET}/: val loss {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
