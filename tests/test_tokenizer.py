"""Our GGUF tokenizer and chat template agree with transformers' reading of the same file."""

from __future__ import annotations

import pytest

from kvscope.engine.loader import default_model_path

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "Unicode: café, naïve, 東京, emoji 🙂",
    "def f(x):\n    return x ** 2  # square",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_encode_matches_transformers(loaded, hf_tokenizer):
    for text in TEXTS:
        assert loaded.codec.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), (
            text
        )
        assert loaded.codec.decode(loaded.codec.encode(text), skip_special=False) == text


def test_digits_split_one_by_one(loaded):
    """SmolLM2's pre-tokenizer ('smollm' in the GGUF) splits every digit."""
    ids = loaded.codec.encode("2024")
    assert [loaded.codec.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_chat_template_matches_transformers(loaded, hf_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a KV cache?"},
    ]
    ours = loaded.codec.render_chat(messages)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
