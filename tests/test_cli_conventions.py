"""The CLI's conventions: --version, the bare command list, one-line mistakes, checks before
the model loads, report's outputs, info's pool, and the dashboard never exiting on bad input."""

from __future__ import annotations

import json

import pytest

from kvscope.app.cli import COMMANDS, main
from kvscope.app.commands.run import RUN_KV_BUDGET
from kvscope.app.engine_options import parse_size

NO_MODEL = "/nonexistent/kvscope-conventions.gguf"


def one_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvscope: error: "), err
    return err


def test_version_and_bare_command_list(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kvscope ")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["run", "--kv-dtype", "int3"], ["--kv-dtype", "int3", "fp8_e4m3", "int4"]),
        (["run", "--eviction-policy", "foo"], ["--eviction-policy", "lru", "lfu", "fifo"]),
        (["calc", "--layers", "-80"], ["--layers", "positive integer", "-80"]),
        (["calc", "--preset", "llama3-8b", "--memory-gib", "nan"], ["--memory-gib", "finite"]),
        (["calc", "--preset", "llama3-8b", "--memory-gib", "inf"], ["--memory-gib", "finite"]),
        (["dash", "--port", "70000"], ["--port", "1-65535"]),
        (["run", "--rate", "nan"], ["--rate", "finite"]),
        (["eval", "passkey", "--lengths", "10"], ["--lengths", "128"]),
        (["generate", "caf\udce9 \udcff"], ["caf\\xe9 \\xff", "not valid UTF-8"]),
    ],
)
def test_mistakes_are_one_line_naming_the_rule(capsys, argv, fragments):
    err = one_error(capsys, argv)
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--page-size", "0"], "--page-size"),
        (["--kv-budget", "0"], "KV budget must be positive"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--kv-budget", "100000GiB"], "more than this machine's memory"),
    ],
)
def test_run_checks_its_inputs_before_the_model_loads(capsys, tmp_path, flags, fragment):
    # The model file does not exist: reaching the loader would say so instead.
    argv = ["run", "--headless", "--db", str(tmp_path / "r.db"), "--model", NO_MODEL, *flags]
    err = one_error(capsys, argv)
    assert fragment in err and "model file not found" not in err


def test_a_bad_jsonl_line_is_refused_before_the_model_loads(capsys, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    argv = ["run", "--headless", "--db", str(tmp_path / "r.db"), "--model", NO_MODEL]
    err = one_error(capsys, [*argv, "--workload", str(wl)])
    assert "w.jsonl:2: not valid UTF-8" in err


def test_tui_without_a_terminal_says_it_needs_one(capsys, synthetic_db):
    path, _, _ = synthetic_db
    err = one_error(capsys, ["tui", str(path)])
    assert "needs a terminal" in err


def test_info_describes_the_pool_run_starts_with():
    from kvscope.app.cli import build_parser

    parser = build_parser()
    info = parser.parse_args(["info"])
    assert info.kv_budget == parse_size(RUN_KV_BUDGET)
    assert info.offload == parser.parse_args(["run"]).offload == "auto"


def test_report_json_to_stdout_and_csv_says_it_is_a_directory(
    capsys, tmp_path, monkeypatch, synthetic_db
):
    path, _, _ = synthetic_db
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {"run", "tables"} <= document.keys()
    assert not list(tmp_path.glob("*.json"))
    assert main(["report", str(path), "--format", "csv", "-o", "run1.csv"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "run1.csv").is_dir() and "run1.csv/: a directory of" in out
    assert len(list((tmp_path / "run1.csv").glob("*.csv"))) == int(out.split()[4])
    (tmp_path / "file.csv").write_text("x")
    err = one_error(capsys, ["report", str(path), "--format", "csv", "-o", "file.csv"])
    assert "writes a directory" in err


def test_eval_defaults_to_runs_pool_grown_for_its_longest_case():
    from kvscope.app.cli import build_parser

    args = build_parser().parse_args(["eval", "passkey"])
    assert args.kv_budget is None  # eval sizes run's 24 MiB pool to its longest case
    kept = build_parser().parse_args(["eval", "passkey", "--kv-budget", "512MiB"])
    assert kept.kv_budget == 512 << 20
