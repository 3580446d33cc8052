"""Bad input to the commands that load a model is refused before the load, as the README says.

Each case points the command at a model that cannot load (a file that does not
exist, or a Hugging Face directory with a config and no weights), so an error
that comes from the argument, and not from the loader, was found first; and no
"loading model" line is printed before it.
"""

from __future__ import annotations

import json

import pytest

from kvscope.app.cli import main

NO_MODEL = "/nonexistent/kvscope-early.gguf"
DUMMY = ["--model", "preset:smollm2-135m", "--load-format", "dummy"]
COMMANDS = {
    "generate": ["generate", "hi"],
    "run": ["run", "--headless", "--requests", "2"],
    "info": ["info"],
    "eval passkey": ["eval", "passkey", "--lengths", "256"],
    "eval perplexity": ["eval", "perplexity", "--lengths", "256"],
}


def refused(capsys, argv: list[str]) -> str:
    """The one error line of a command that stopped before loading anything."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvscope: error: "), err
    assert "loading model" not in err
    return err


def command(name: str, tmp_path) -> list[str]:
    argv = list(COMMANDS[name])
    return [*argv, "--db", str(tmp_path / "r.db")] if name == "run" else argv


def weightless_model(tmp_path) -> str:
    """A Hugging Face directory whose config reads and whose weights are missing: any
    command that reaches the load fails there, naming the missing files."""
    folder = tmp_path / "no-weights"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 300,
        "max_position_embeddings": 512,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_unknown_cost_device_is_refused_before_the_model_loads(capsys, tmp_path, name):
    err = refused(capsys, [*command(name, tmp_path), "--model", NO_MODEL, "--cost-device", "tpu9"])
    assert "--cost-device: unknown device 'tpu9'" in err and "h100-80" in err
    assert not (tmp_path / "r.db").exists()  # run makes no database for a run it refuses


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_budget_without_room_for_two_pages_is_refused_before_the_model_loads(
    capsys, tmp_path, name
):
    argv = [*command(name, tmp_path), "--kv-budget", "10"]
    err = refused(capsys, [*argv, *DUMMY])
    assert "KV budget of 10 bytes holds 0 pages of 737280 bytes; raise --kv-budget" in err
    # From a model directory's config, before its (missing) weights are looked for.
    err = refused(capsys, [*argv, "--model", weightless_model(tmp_path)])
    assert "KV budget of 10 bytes holds 0 pages" in err and "safetensors" not in err
    assert not (tmp_path / "r.db").exists()


def test_a_budget_is_checked_against_a_gguf_models_header(capsys, tmp_path, monkeypatch):
    """The default GGUF model, its conversion not cached: the header says the shape, and
    the load that follows reuses the reader that read it."""
    from kvscope.engine import loader

    monkeypatch.setenv("KVSCOPE_CACHE", str(tmp_path / "cache"))
    err = refused(capsys, ["generate", "hi", "--kv-budget", "10"])
    assert "holds 0 pages of 737280 bytes" in err  # SmolLM2: 30 layers x 3 KV heads x 64, fp32
    config = loader.read_config(None)
    assert loader._peeked is not None
    assert loader.load_model(None).config.num_layers == config.num_layers == 30
    assert loader._peeked is None  # the load took the reader over


def test_a_model_that_cannot_be_read_is_still_reported_by_the_load(capsys):
    assert main(["generate", "hi", "--model", NO_MODEL, "--kv-budget", "10"]) == 2
    err = capsys.readouterr().err
    assert "loading model" in err and "model file not found" in err


def test_an_empty_prompt_is_refused_before_the_model_loads(capsys):
    err = refused(capsys, ["generate", "", "--model", NO_MODEL])
    assert "prompt 1: empty prompt" in err
    err = refused(capsys, ["generate", "a", "", "b", "", "--model", NO_MODEL])
    assert "prompts 2, 4: empty prompt" in err
    # A chat template wraps even an empty message in tokens: that one goes on to the load.
    assert main(["generate", "", "--chat", "--model", NO_MODEL]) == 2
    assert "model file not found" in capsys.readouterr().err


def test_good_values_still_reach_the_load(capsys, tmp_path):
    argv = [*command("info", tmp_path), "--model", NO_MODEL, "--cost-device", "h100-80"]
    assert main([*argv, "--kv-budget", "64MiB"]) == 2
    assert "model file not found" in capsys.readouterr().err
