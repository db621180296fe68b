"""Name tables (``NameList``: one blob of UTF-8, ``UnitURLs``: a root and those names) index and
slice exactly as the list of their strings does, from the front and from the end."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupipe.formats.folder import NameList
from gpupipe.sources.source import UnitURLs

NAMES = st.lists(st.text(max_size=6), max_size=12)


@given(names=NAMES, start=st.integers(-15, 15), stop=st.integers(-15, 15), step=st.sampled_from([1, 2, -1, -3]))
def test_a_name_list_indexes_and_slices_as_its_list(names, start, stop, step):
    table = NameList(names)
    assert len(table) == len(names) and list(table) == names
    assert table[start:stop:step] == names[start:stop:step]
    for i in range(-len(names), len(names)):
        assert table[i] == names[i]
    for i in (len(names), -len(names) - 1):
        with pytest.raises(IndexError):
            table[i]


@given(names=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=6), data=st.data())
def test_unit_urls_name_each_unit_by_its_file(names, data):
    file_of = np.array(data.draw(st.lists(st.integers(0, len(names) - 1), max_size=10)), dtype=np.int64)
    urls = UnitURLs("s3://b/root", NameList(names), file_of)
    expected = ["s3://b/root/" + names[f] for f in file_of]
    assert list(urls) == expected and urls[::-1] == expected[::-1]
    if expected:
        assert urls[-1] == expected[-1]
    assert list(UnitURLs("s3://b/root/", NameList(names))) == ["s3://b/root/" + n for n in names]
