"""The autotuner's on-disk cache is asked for only where Triton has it (3.4 and later)."""

from __future__ import annotations

import inspect

import triton

from kvscope.kernels.launch_configs import autotune_cache_kwargs


def test_cache_results_only_from_triton_3_4():
    assert autotune_cache_kwargs("3.3.1") == {}
    assert autotune_cache_kwargs("2.3.0+git1234") == {}
    assert autotune_cache_kwargs("3.4.0") == {"cache_results": True}
    assert autotune_cache_kwargs("3.10.0") == {"cache_results": True}


def test_the_installed_triton_accepts_what_the_guard_passes():
    kwargs = autotune_cache_kwargs()
    assert set(kwargs) <= set(inspect.signature(triton.autotune).parameters)
