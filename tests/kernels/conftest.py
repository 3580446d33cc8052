"""Kernel tests run Triton in its CPU interpreter; it must be on before triton loads."""

from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.triton_kv import interpreting  # noqa: E402

if not interpreting():
    pytest.exit(
        "triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1; "
        "run with TRITON_INTERPRET=1 in the environment",
        returncode=4,
    )


@pytest.fixture
def seed() -> int:
    """Fresh random inputs every run; the seed goes into failure messages to replay one."""
    value = random.SystemRandom().randrange(2**31)
    torch.manual_seed(value)
    return value
