"""Readers and writers of data at rest: WebDataset tar shards, image folders, Parquet."""
__all__: list[str] = []
