"""The start-up cache of converted GGUF weights returns exactly what a fresh conversion gives."""

from __future__ import annotations

import pytest
import torch

from kvscope.engine import loader

pytestmark = pytest.mark.slow


def test_cached_load_equals_fresh_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_CACHE", str(tmp_path))
    path = loader.default_model_path()
    fresh = loader.load_model(path, use_cache=False)
    assert not list(tmp_path.iterdir())  # use_cache=False writes nothing
    first = loader.load_model(path)  # converts and stores
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".safetensors"]
    cached = loader.load_model(path)  # reads the cache
    for model in (first, cached):
        assert model.config == fresh.config
        assert model.weights.keys() == fresh.weights.keys()
        assert all(torch.equal(model.weights[k], fresh.weights[k]) for k in fresh.weights)
        text = "<|im_start|>user\nHello 2024, café!<|im_end|>"
        assert model.codec.encode(text) == fresh.codec.encode(text)
        assert model.codec.render_chat(
            [{"role": "user", "content": "hi"}]
        ) == fresh.codec.render_chat([{"role": "user", "content": "hi"}])


def test_corrupt_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_CACHE", str(tmp_path))
    path = loader.default_model_path()
    loader.load_model(path)
    [tensors] = tmp_path.glob("*.safetensors")
    tensors.write_bytes(b"not a safetensors file")
    model = loader.load_model(path)  # falls back to converting, and rewrites the entry
    assert model.weights["model.norm.weight"].shape == (model.config.hidden_size,)
    assert tensors.stat().st_size > 1 << 20
