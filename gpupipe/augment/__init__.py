"""Batch augmentation on the device: per-sample keyed randomness, Kornia underneath."""
__all__: list[str] = []
