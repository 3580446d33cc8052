"""Bad input: one clear line on stderr, a non-zero exit, no traceback; good prompts still answered."""

from __future__ import annotations

import json
import subprocess

import pytest

from kvscope.app.cli import main
from kvscope.engine.loader import default_model_path

from support.installed import KVSCOPE


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    # "[kvscope] loading model ..." progress lines may come first; the error is one line.
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[kvscope] ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("kvscope: error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0]


def test_missing_model_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path / "nope.gguf"))
    assert code == 2
    assert_one_line_error(err, "model file not found")


def test_truncated_model_file(capsys, tmp_path):
    bad = tmp_path / "cut.gguf"
    with open(default_model_path(), "rb") as src:
        bad.write_bytes(src.read(1 << 20))
    code, _, err = run_cli(capsys, "info", "--model", str(bad))
    assert code == 2
    assert_one_line_error(err, "not a readable GGUF file")


def test_unsupported_architecture_dir(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path))
    assert code == 2
    assert_one_line_error(err, "unsupported architecture 'mamba'")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--top-k", "-3"], "top_k must be >= 0"),
        (["--max-tokens", "0"], "max_tokens must be at least 1"),
    ],
)
def test_invalid_sampling_values(capsys, flags, fragment):
    code, _, err = run_cli(capsys, "generate", "hi", *flags)
    assert code == 2
    assert_one_line_error(err, fragment)


@pytest.mark.slow
def test_too_long_prompts_refused_others_answered(capsys):
    too_long_for_context = "word " * 9000
    too_big_for_budget = "word " * 800  # the 1 MiB budget holds 16 pages x 16 tokens
    code, out, err = run_cli(
        capsys,
        "generate",
        "The capital of France is",
        too_long_for_context,
        too_big_for_budget,
        "--json",
        "--max-tokens",
        "4",
        "--kv-budget",
        str(16 * 16 * 46080),
    )
    assert code == 2
    errors = [ln for ln in err.strip().splitlines() if not ln.startswith("[kvscope] ")]
    assert len(errors) == 2
    assert "prompt 2:" in errors[0] and "does not fit the model's context of 8192" in errors[0]
    assert "prompt 3:" in errors[1] and "whole KV budget" in errors[1]
    rows = [json.loads(line) for line in out.splitlines()]
    assert [("error" in r) for r in rows] == [False, True, True]
    assert rows[0]["finish_reason"] == "length" and len(rows[0]["token_ids"]) == 4
    assert rows[0]["text"].strip().startswith("Paris")


def test_bad_kv_budget_flag_is_one_line():
    # argparse errors go through the real executable: usage + one error line, exit 2.
    proc = subprocess.run([KVSCOPE, "info", "--kv-budget", "lots"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "invalid size 'lots'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        # an option a command lacks, then its value: argparse had offered the value as a
        # subcommand ("invalid choice: 'nope' (choose from 'offload', 'cliff')")
        (["calc", "--model", "nope"], "unrecognized arguments: --model (see kvscope calc"),
        (["calc", "--context=4k", "cliff"], "unrecognized arguments: --context=4k"),
        (["--model", "x", "run"], "unrecognized arguments: --model (see kvscope --help)"),
        # a mistyped subcommand is still named as one; an abbreviated option is no stranger
        (["calc", "--preset", "smollm2-135m", "offlod"], "invalid choice: 'offlod'"),
        (["calc", "--preset", "smollm2-135m", "--input", "10", "2"], "invalid choice: '2'"),
        # a missing positional had hidden the stray option
        (["eval", "--nope"], "arguments are required: TASK; not an option of kvscope eval: --nope"),
        (
            ["replay", "--limit", "5", "--bogus=1"],
            "TRACE; not an option of kvscope replay: --bogus=1 (",
        ),
        # what no command took points at the command's help, where its options are
        (["run", "--no-tui"], "unrecognized arguments: --no-tui (see kvscope run --help)"),
        (["calc", "cliff", "--x", "1"], "arguments: --x 1 (see kvscope calc cliff --help)"),
    ],
)
def test_an_unknown_option_is_named_not_its_value(capsys, argv, fragment):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, fragment)


def test_unknown_workload_and_bad_jsonl(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--headless", "--workload", "nonsense")
    assert code == 2
    assert_one_line_error(err, "unknown workload 'nonsense'")
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt": "ok"}\n{"prompt": "x", "max_tokens": -2}\n')
    code, _, err = run_cli(capsys, "run", "--headless", "--workload", str(wl))
    assert code == 2
    assert_one_line_error(err, "w.jsonl:2: 'max_tokens' must be a positive integer")
    # replay's kvscope traces take token ids; a workload line says what it takes instead
    wl.write_text('{"prompt": "ok"}\n{"prompt_token_ids": [1, 2]}\n')
    code, _, err = run_cli(capsys, "run", "--headless", "--workload", str(wl))
    assert code == 2
    assert_one_line_error(
        err,
        "w.jsonl:2: unknown field(s) prompt_token_ids (a workload line has prompt, "
        "max_tokens, arrival_s, system, chat)",
    )


def test_unwritable_db(capsys, tmp_path):
    code, _, err = run_cli(
        capsys,
        "run",
        "--headless",
        "--requests",
        "1",
        "--db",
        str(tmp_path / "no" / "such" / "dir" / "x.db"),
    )
    assert code == 2
    assert_one_line_error(err)
    not_sqlite = tmp_path / "text.db"
    not_sqlite.write_text("hello, this is not a database\n" * 100)
    code, _, err = run_cli(capsys, "run", "--headless", "--requests", "1", "--db", str(not_sqlite))
    assert code == 2
    assert_one_line_error(err)


def test_a_command_module_that_fails_to_import_raises_its_real_error(monkeypatch, tmp_path):
    import kvscope.app.cli as cli
    import kvscope.app.commands as commands

    (tmp_path / "broken.py").write_text("import kvscope_no_such_dependency\n")
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "broken"))
    with pytest.raises(ModuleNotFoundError) as exc:
        cli.build_parser()
    assert exc.value.name == "kvscope_no_such_dependency"


def test_a_listed_command_without_a_module_is_not_skipped(monkeypatch):
    import kvscope.app.cli as cli

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "ghost"))
    with pytest.raises(ModuleNotFoundError) as exc:
        cli.build_parser()
    assert exc.value.name == "kvscope.app.commands.ghost"
