"""The step staging buffer on the CPU: typed sections round-trip, growth, a fixed layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvscope.engine.staging import StagingBuffer


def test_sections_of_two_dtypes_read_back_from_one_buffer():
    staging = StagingBuffer(64, "cpu")
    staging.begin(StagingBuffer.section_bytes((3, torch.int64), (5, torch.int32)))
    a = staging.put([7, -1, 2**40], torch.int64)
    b = staging.put(np.arange(5), torch.int32)
    assert (a, b) == (0, 24) and staging.used == 24 + 24  # 20 bytes, aligned to 8
    staging.commit()  # the CPU: nothing to copy
    assert staging.view(a, 3, torch.int64).tolist() == [7, -1, 2**40]
    assert staging.view(b, 5, torch.int32).tolist() == [0, 1, 2, 3, 4]
    assert staging.copies == 0


def test_a_growable_buffer_grows_and_a_fixed_one_refuses():
    staging = StagingBuffer(16, "cpu")
    staging.begin(1000)
    assert staging.nbytes >= 1000
    offset = staging.put(list(range(100)), torch.int64)
    assert staging.view(offset, 100, torch.int64).sum().item() == sum(range(100))
    fixed = StagingBuffer(16, "cpu", fixed=True)
    with pytest.raises(AssertionError, match="fixed staging buffer"):
        fixed.begin(1000)
