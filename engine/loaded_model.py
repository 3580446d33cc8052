"""What a load hands the engine: config, weights, tokenizer and where they came from.

Its own module so that every way of making one (``engine.loader`` from a file,
``engine.dummy`` from a shape, ``engine.tiny`` for tests) depends on it and on
nothing of the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.engine.model_config import ModelConfig
from kvscope.engine.tokenizer import TextCodec


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    codec: TextCodec
    source: str
