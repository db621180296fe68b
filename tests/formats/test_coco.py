"""gpupipe.formats.coco: a COCO instances file → a packed per-image table; every defect named."""
from __future__ import annotations

import copy
import io
import json
import pickle

import numpy as np
import pytest

from gpupipe.core.errors import ConfigError, ShardFormatError
from gpupipe.formats.annotations import parse_boxes
from gpupipe.formats.coco import mask_png, parse_coco

DOC = {
    "images": [{"id": 30, "file_name": "b.jpg", "width": 20, "height": 10},
               {"id": 10, "file_name": "a.jpg", "width": 8, "height": 8},
               {"id": 50, "file_name": "empty.jpg", "width": 8, "height": 6}],
    "annotations": [
        {"id": 1, "image_id": 10, "bbox": [1, 1, 2.5, 3], "category_id": 7, "iscrowd": 0,
         "segmentation": [[1, 1, 5, 1, 5, 5, 1, 5]]},
        {"id": 2, "image_id": 30, "bbox": [0.1, 0.2, 5.3, 0], "category_id": 2, "iscrowd": 0, "segmentation": []},
        {"id": 3, "image_id": 10, "bbox": [0, 0, 1, 1], "category_id": 2, "iscrowd": 1,
         "segmentation": {"counts": [1, 2], "size": [8, 8]}},
        {"id": 4, "image_id": 10, "bbox": [3, 3, 1.25, 1], "category_id": 2, "iscrowd": 0,
         "segmentation": [[3, 3, 6, 3, 6, 6]]},
    ],
    "categories": [{"id": 7, "name": "dog"}, {"id": 2, "name": "cat"}],
}


def parsed(doc=DOC, **kw):
    return parse_coco(json.dumps(doc).encode(), "mem://ann/instances_x.json", **kw)


def test_boxes_are_packed_per_image_xyxy_float32_labels_by_category_id_order():
    t = parsed().aligned(["a.jpg", "b.jpg", "empty.jpg"], "folder/")
    assert t.classes == ("cat", "dog")  # category 2 before category 7
    assert t.counts.tolist() == [2, 1, 0]  # the crowd annotation of a.jpg is dropped; empty.jpg has none
    assert t.boxes.dtype == np.float32 and t.labels.dtype == np.int64
    want = np.array([[1, 1, 3.5, 4], [3, 3, 4.25, 4], [0.1, 0.2, 0.1 + 5.3, 0.2]], dtype=np.float64)
    assert np.array_equal(t.boxes, want.astype(np.float32))
    assert t.labels.tolist() == [1, 0, 0] and t.ann_ids.tolist() == [1, 4, 2]
    boxes, labels = parse_boxes(t.fields(0, ("boxes",))["json"], "a")  # the member reads back bit-exact
    assert np.array_equal(boxes, t.boxes[:2]) and labels.tolist() == [1, 0]
    assert parse_boxes(t.fields(2, ("boxes",))["json"], "empty")[0].shape == (0, 4)


def test_a_given_class_list_numbers_categories_by_name_and_refuses_others():
    t = parsed(classes=["bird", "dog", "cat"])
    assert t.classes == ("bird", "dog", "cat")
    assert t.aligned(["a.jpg", "b.jpg", "empty.jpg"], "f").labels.tolist() == [1, 2, 2]
    with pytest.raises(ConfigError, match="cat"):
        parsed(classes=["dog"])


def test_the_table_pickles_as_a_few_arrays_not_objects_per_image():
    doc = copy.deepcopy(DOC)
    doc["images"] += [{"id": 100 + i, "file_name": f"x{i:04d}.jpg", "width": 9, "height": 9} for i in range(2000)]
    doc["annotations"] += [{"id": 100 + i, "image_id": 100 + i, "bbox": [1, 2, 3, 4], "category_id": 2}
                           for i in range(2000)]
    t = parsed(doc)
    size = len(pickle.dumps(t))
    assert size < 2003 * 120, size  # ~ 100 bytes an image: names, sizes, offsets, one box, label, ids
    assert pickle.loads(pickle.dumps(t)).boxes.tolist() == t.boxes.tolist()


def test_polygon_masks_are_label_maps_of_the_image_size_in_annotation_order():
    t = parsed().aligned(["a.jpg", "b.jpg", "empty.jpg"], "f")
    mask = t.mask(0)
    assert mask.shape == (8, 8) and mask.dtype == np.uint8
    assert mask[2, 2] == 2 and mask[0, 0] == 0  # dog (index 1) + 1
    assert mask[4, 4] == 1  # the cat polygon, painted after the dog's, covers it where they overlap
    assert t.mask(2).shape == (6, 8) and not t.mask(2).any()
    from PIL import Image

    png = t.fields(0, ("masks",))["mask.png"]
    back = Image.open(io.BytesIO(png))
    assert back.mode == "L" and np.array_equal(np.asarray(back), mask)
    assert mask_png(mask) == png


def test_an_rle_segmentation_is_refused_for_masks_but_not_for_boxes():
    doc = copy.deepcopy(DOC)
    doc["annotations"][3]["segmentation"] = {"counts": "abc", "size": [8, 8]}
    t = parsed(doc).aligned(["a.jpg", "b.jpg", "empty.jpg"], "f")
    assert len(t.fields(0, ("boxes",))) == 1
    with pytest.raises(ShardFormatError, match=r"'a.jpg'.*annotation 4.*RLE.*not supported"):
        t.fields(0, ("boxes", "masks"))


def edit(path: str, value):
    doc = copy.deepcopy(DOC)
    node = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[keys[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("path", "value", "message"), [
    ("annotations.0.bbox", [1, 2, 3], r"annotation 1 of image 'a.jpg': bbox is \[1, 2, 3\], not four finite"),
    ("annotations.0.bbox", [1, 2, "3", 4], r"annotation 1 of image 'a.jpg': bbox .* not four finite"),
    ("annotations.3.bbox", [1, 2, float("nan"), 4], r"annotation 4 of image 'a.jpg': bbox .* not four finite"),
    ("annotations.1.bbox", [1, 2, -1, 4], r"annotation 2 of image 'b.jpg': bbox .* negative width or height"),
    ("annotations.1.bbox", [1, 2, 1, -0.5], r"annotation 2 of image 'b.jpg': bbox .* negative width or height"),
    ("annotations.0.category_id", 99, r"annotation 1 of image 'a.jpg': category_id 99 is not among the categories"),
    ("annotations.1.image_id", 31, r"annotation 2: image_id 31 is not among the images"),
    ("annotations.0.segmentation", [[1, 2, 3]], r"annotation 1 of image 'a.jpg': segmentation"),
    ("images.1.width", 0, r"images\[1\]"),
    ("images.1.file_name", "b.jpg", r"images\[1\].*listed twice"),
    ("categories.0.id", 2, r"categories: .* listed twice"),
])
def test_bad_annotations_are_named(path, value, message):
    with pytest.raises(ShardFormatError, match=message) as got:
        parse_coco(edit(path, value), "mem://ann/instances_x.json")
    assert got.value.shard == "mem://ann/instances_x.json"


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe", b"[]", b'{"images": [], "annotations": []}'])
def test_a_file_that_is_not_coco_json_is_named(data):
    with pytest.raises(ShardFormatError, match="instances_x.json.*(JSON|COCO)"):
        parse_coco(data, "mem://ann/instances_x.json")


def test_aligning_to_a_folder_names_unlisted_and_missing_images():
    t = parsed()
    with pytest.raises(ConfigError, match=r"1 image\(s\) of f/ are not in .*instances_x.json \(stray.jpg\)"):
        t.aligned(["a.jpg", "b.jpg", "empty.jpg", "stray.jpg"], "f/")
    with pytest.raises(ConfigError, match=r"lists 1 image\(s\) that are not images in f/ \(empty.jpg\)"):
        t.aligned(["a.jpg", "b.jpg"], "f/")
