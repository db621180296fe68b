"""Preparing data at rest: shards and ``index.json`` from image folders, Parquet or Delta
(:func:`~gpupipe.prepare.ingest.ingest`, re-encoding on the way: :mod:`gpupipe.prepare.reencode`),
and the index of shards written elsewhere (:func:`~gpupipe.prepare.indexer.index`). Library API:
the CLI's ``gpupipe ingest`` / ``gpupipe index`` call these, as a user's own job can."""
