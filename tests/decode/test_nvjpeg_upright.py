"""The nvjpeg backend applies EXIF orientation itself (torchvision's CUDA decode ignores
``apply_exif_orientation``: seen on an H200, torchvision 0.26, where every exif-2..8 case of the
decode contract came out as stored). Its transpose must be Pillow's ``ImageOps.exif_transpose``."""
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from gpupipe.decode.nvjpeg import upright


@pytest.mark.parametrize("orientation", range(0, 10))
def test_upright_is_pillows_exif_transpose(orientation):
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    image = Image.fromarray(stored)
    image.getexif()[0x0112] = orientation
    expected = np.asarray(ImageOps.exif_transpose(image))
    if orientation in (0, 9):  # not an orientation: both leave the image as stored
        expected = stored
    got = upright(torch.from_numpy(stored).permute(2, 0, 1), orientation).permute(1, 2, 0).numpy()
    assert got.shape == expected.shape and np.array_equal(got, expected)
