"""Kernel tests run Triton in its CPU interpreter; it must be on before triton loads."""

from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kvscope.kernels.triton_kv import interpreting  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreter_on() -> None:
    """Fail these tests, and only these, when triton loaded before the variable was set."""
    if not interpreting():
        pytest.fail(
            "triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1; "
            "set it in the environment or at the top of tests/conftest.py"
        )


@pytest.fixture
def seed() -> int:
    """Fresh random inputs every run; the seed goes into failure messages to replay one."""
    value = random.SystemRandom().randrange(2**31)
    torch.manual_seed(value)
    return value
