"""Tokenizer and chat template, from a GGUF file's own metadata or a ``tokenizer.json``.

GGUF files carry their vocabulary, BPE merges and chat template, so the model
file alone is enough to run. SmolLM2's ``smollm`` pre-tokenizer splits digits
one by one and then applies GPT-2's byte-level regex; we build the same
pipeline with the ``tokenizers`` library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from kvscope.engine.errors import ModelLoadError

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _pre_tokenizer(pre_type: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre_type in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def build_bpe_tokenizer(
    tokens: list[str], merges: list[str], token_types: list[int], pre_type: str
) -> Tokenizer:
    """A byte-level BPE tokenizer from GGUF ``tokenizer.ggml.*`` arrays."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre_type)
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, token_types, strict=False)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    tok.add_special_tokens(special)
    return tok


@dataclass
class TextCodec:
    """Encode/decode text and render chat prompts for one model."""

    tokenizer: Tokenizer
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    _template: Any = field(default=None, init=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The model's own chat template, ready for generation."""
        if not self.chat_template:
            raise ModelLoadError("this model carries no chat template; run without --chat")
        if self._template is None:
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=True)

    def to_json(self) -> str:
        """Serialized form for the start-up cache."""
        return json.dumps(
            {
                "tokenizer": self.tokenizer.to_str(),
                "eos_token_ids": self.eos_token_ids,
                "bos_token_id": self.bos_token_id,
                "add_bos": self.add_bos,
                "chat_template": self.chat_template,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TextCodec:
        raw = json.loads(text)
        return cls(
            tokenizer=Tokenizer.from_str(raw["tokenizer"]),
            eos_token_ids=raw["eos_token_ids"],
            bos_token_id=raw["bos_token_id"],
            add_bos=raw["add_bos"],
            chat_template=raw["chat_template"],
        )

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> TextCodec:
        model = fields.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelLoadError(
                f"unsupported GGUF tokenizer model {model!r} (kvscope reads byte-level BPE 'gpt2')"
            )
        tokens = fields["tokenizer.ggml.tokens"]
        tokenizer = build_bpe_tokenizer(
            tokens,
            fields["tokenizer.ggml.merges"],
            fields.get("tokenizer.ggml.token_type", [1] * len(tokens)),
            str(fields.get("tokenizer.ggml.pre", "gpt2")),
        )
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eos_ids = [int(eos)] if eos is not None else []
        # ChatML models end a turn with <|im_end|>; plain text ends with <|endoftext|>.
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = tokenizer.token_to_id(name)
            if tid is not None and tid not in eos_ids:
                eos_ids.append(tid)
        bos = fields.get("tokenizer.ggml.bos_token_id")
        return cls(
            tokenizer=tokenizer,
            eos_token_ids=eos_ids,
            bos_token_id=int(bos) if bos is not None else None,
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=fields.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, directory: Path) -> TextCodec:
        path = directory / "tokenizer.json"
        if not path.exists():
            raise ModelLoadError(f"no tokenizer.json in {directory}")
        tokenizer = Tokenizer.from_file(str(path))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        gen_path = directory / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        eos = gen.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        if not eos_ids and isinstance(config.get("eos_token"), str):
            tid = tokenizer.token_to_id(config["eos_token"])
            eos_ids = [tid] if tid is not None else []
        bos = gen.get("bos_token_id")
        return cls(
            tokenizer=tokenizer,
            eos_token_ids=[int(e) for e in eos_ids],
            bos_token_id=bos,
            add_bos=bool(config.get("add_bos_token", False)),
            chat_template=config.get("chat_template"),
        )


def _raise_template_error(message: str) -> None:
    raise ModelLoadError(f"chat template error: {message}")
