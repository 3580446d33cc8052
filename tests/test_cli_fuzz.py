"""Every subcommand's numeric and text inputs, given hostile values: one error line or a success.

Each case runs in-process through ``kvscope.app.cli.main``. Commands that load a model
are pointed at a model file that does not exist, so a value the checks let
through ends at "model file not found" (one line, exit 2) instead of a load:
no case here loads a model, and a bad value must be refused before that line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from kvscope.app.cli import COMMANDS, main
from kvscope.db.migrations import migrate
from kvscope.db.store import open_db

NO_MODEL = "/nonexistent/kvscope-fuzz.gguf"
NOT_FOUND = "model file not found"
HOSTILE = ("nan", "inf", "-inf", "-1", "0", "1e308", "99999999999999999999", "", "x", "\udcff")


def call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_clean(argv: list[str], code: int, err: str) -> None:
    """Exit 0, or exit 2 with exactly one ``kvscope: error:`` line; never a traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[kvscope]")]
    assert "Traceback" not in err, (argv, err)
    if code == 0:
        return
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and lines[0].startswith("kvscope: error: "), (argv, err)


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fuzz") / "empty.db"
    open_db(path).conn.close()
    return str(path)


ENGINE_FLAGS = (
    "--kv-budget",
    "--memory-fraction",
    "--page-size",
    "--host-budget",
    "--max-batched-tokens",
    "--max-num-seqs",
    "--infllm-initial-tokens",
    "--infllm-local-tokens",
    "--infllm-topk-blocks",
    "--infllm-block-pages",
    "--infllm-repr-tokens",
    "--threads",
    "--kv-dtype",
    "--eviction-policy",
    "--device",
    "--cost-device",
)


def engine_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv prefix, flag) for every command that runs the engine."""
    db = str(tmp / "run.db")
    prefixes = {
        "run": ["run", "--headless", "--db", db, "--requests", "2"],
        "generate": ["generate", "hi"],
        "info": ["info"],
        "eval passkey": ["eval", "passkey", "--lengths", "256"],
        "eval perplexity": ["eval", "perplexity", "--lengths", "256"],
    }
    own = {
        "run": ["--requests", "--rate", "--seed", "--metrics-port", "--workload"],
        "generate": ["--max-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--stop"],
        "info": [],
        "eval passkey": ["--lengths", "--depths", "--seed"],
        "eval perplexity": ["--lengths", "--chunk", "--seed"],
    }
    cases = []
    for name, prefix in prefixes.items():
        for flag in (*own[name], *ENGINE_FLAGS):
            cases.append(([*prefix, "--model", NO_MODEL], flag))
        if name == "info":
            cases.append(
                (["info", "--attention-mode", "infllm", "--model", NO_MODEL], "--page-size")
            )
    return cases


def test_engine_commands_refuse_hostile_values_before_the_model_loads(tmp_path):
    for prefix, flag in engine_cases(tmp_path):
        for value in HOSTILE:
            argv = [*prefix, flag, value]
            code, _, err = call(argv)
            assert_clean(argv, code, err)
            assert code == 2, argv  # the model file does not exist: no case can succeed
            if value in ("nan", "inf", "-inf", "-1", "x", "\udcff"):
                # Never a valid number of anything here: refused by the checks, not the loader.
                if flag not in ("--seed", "--stop", "--device", "--cost-device", "--workload"):
                    assert NOT_FOUND not in err, argv


def test_generate_prompts_of_any_text(tmp_path):
    for prompt in ("", " ", "caf\udce9 \udcff", "\x00", "x" * 100_000):
        argv = ["generate", prompt, "--model", NO_MODEL]
        code, _, err = call(argv)
        assert_clean(argv, code, err)


OFFLINE = {
    "calc": (
        ["calc", "--preset", "llama3-8b", "--device", "h100-80"],
        [
            "--memory-gib",
            "--weights-gib",
            "--overhead-gib",
            "--activation-gib",
            "--input-tokens",
            "--output-tokens",
            "--max-model-len",
            "--seq-len",
            "--params",
            "--layers",
            "--preset",
            "--device",
            "--kv-dtype",
            "--config",
            "--gguf",
        ],
    ),
    "calc explicit": (
        ["calc", "--layers", "32", "--q-heads", "32", "--kv-heads", "8", "--head-dim", "128"],
        ["--layers", "--q-heads", "--kv-heads", "--head-dim", "--params", "--memory-gib"],
    ),
    "calc offload": (
        ["calc", "offload", "--preset", "llama3-8b", "--device", "h100-80"],
        ["--pcie-gbps", "--tflops", "--kv-width", "--params"],
    ),
    "calc cliff": (
        ["calc", "cliff", "--preset", "llama3-8b", "--device", "h100-80"],
        [
            "--tflops",
            "--hbm-gbps",
            "--resident-tokens",
            "--max-context",
            "--memory-gib",
            "--input-tokens",
            "--output-tokens",
        ],
    ),
    "simulate": (
        ["simulate", "--requests", "20"],
        [
            "--requests",
            "--prompt-len",
            "--output-len",
            "--rate",
            "--seed",
            "--budget-tokens",
            "--kv-gib",
            "--preset",
            "--kv-dtype",
            "--page-size",
            "--max-model-len",
            "--step-ms",
            "--trace",
            "--distribution",
        ],
    ),
}


@pytest.mark.parametrize("name", list(OFFLINE))
def test_offline_commands_answer_or_refuse_in_one_line(name, tmp_path):
    prefix, flags = OFFLINE[name]
    for flag in flags:
        for value in HOSTILE:
            argv = [*prefix, flag, value]
            code, _, err = call(argv)
            assert_clean(argv, code, err)


def test_database_commands(empty_db, tmp_path):
    cases = [
        (["runs"], ["--db"]),
        (["report", empty_db], ["--run", "--format", "-o", "--db"]),
        (["tui", empty_db], ["--run", "--db"]),
        (["dash", str(tmp_path / "none.db")], ["--port", "--refresh", "--host"]),
    ]
    for prefix, flags in cases:
        for flag in flags:
            for value in HOSTILE:
                argv = [*prefix, flag, value]
                code, _, err = call(argv)
                assert_clean(argv, code, err)
    for db in ("", "\udcff", str(tmp_path), "/nonexistent/dir/x.db", empty_db):
        for command in ("runs", "report", "tui"):
            argv = [command, db]
            code, _, err = call(argv)
            assert_clean(argv, code, err)


def test_jsonl_workload_lines(tmp_path):
    """Bad workload lines, each refused by line number before the model loads."""
    lines = [
        b'{"prompt": "caf\xe9 \xff"}',
        b'{"prompt": "\\ud800"}',
        b'{"prompt": "ok", "arrival_s": NaN}',
        b'{"prompt": "ok", "arrival_s": Infinity}',
        b'{"prompt": "ok", "arrival_s": 1e300}',
        b'{"prompt": "ok", "max_tokens": 1.5}',
        b'{"prompt": "ok", "max_tokens": -1}',
        b'{"prompt": ""}',
        b'{"prompt": 3}',
        b"[1, 2]",
        b"\xff\xfe",
    ]
    for i, line in enumerate(lines):
        wl = tmp_path / f"w{i}.jsonl"
        wl.write_bytes(b'{"prompt": "fine"}\n' + line + b"\n")
        argv = ["run", "--headless", "--db", str(tmp_path / "w.db"), "--workload", str(wl)]
        code, _, err = call([*argv, "--model", NO_MODEL])
        assert_clean(argv, code, err)
        assert code == 2 and f"w{i}.jsonl:2:" in err and NOT_FOUND not in err, (line, err)


def test_every_command_is_fuzzed():
    covered = {"run", "generate", "info", "eval", "calc", "simulate", "runs", "report", "tui"}
    covered |= {"dash", "watch", "replay"}
    assert set(COMMANDS) <= covered, set(COMMANDS) - covered


def test_watch_numeric_flags(tmp_path):
    """``watch`` (app/commands/watch.py, another issue's): its flags, with the duration finite."""
    db = str(tmp_path / "watch.db")
    for flag in ("--dp-size", "--scrape-interval"):
        for value in HOSTILE:
            argv = ["watch", db, "--source", "tcp://127.0.0.1:1", flag, value, "--duration", "0.2"]
            code, _, err = call(argv)
            assert_clean(argv, code, err)
    # A duration or scrape interval that is not a positive finite number never starts a watch
    # (an infinite one never stopped; NaN exited 0 at once).
    for flag in ("--duration", "--scrape-interval", "--keep-raw"):
        for value in ("inf", "nan", "0", "-1", "1e308", "1e300d"):
            argv = ["watch", db, "--source", "tcp://127.0.0.1:1", flag, value]
            code, _, err = call(argv)
            assert_clean(argv, code, err)
            assert code == 2 and flag in err, (argv, err)


@pytest.mark.parametrize(
    "inputs",
    [
        (None, None, None, None),
        ("llama3-8b", "h100-80", None, 25),
        ("llama3-8b", "", "fp8_e4m3", 25),
        ("nope", "h100-80", "fp8_e4m3", 25),
        ("llama3-8b", "h100-80", "int3", 25),
        ("llama3-8b", "h100-80", "fp8_e4m3", float("nan")),
        ("llama3-8b", "h100-80", "fp8_e4m3", 150),
    ],
)
def test_sizing_page_callback_shows_bad_input_on_the_page(inputs, tmp_path):
    """The Sizing page's callback answers every input with a page, never ends the server."""
    from kvscope.app.dashboard.server import create_app

    from support.dash_callbacks import call as call_callback

    path = tmp_path / "d.db"
    open_db(path).conn.close()
    app = create_app(path)
    tiles, fig = call_callback(app, "sizing-tiles.children", *inputs)
    text = str(tiles)
    assert "choose a" in text or "resident share" in text, text
    assert fig.layout.annotations  # the chart says so too


REPLAY_FLAGS = (
    "--block-size",
    "--limit",
    "--capacity",
    "--eviction-policy",
    "--page-size",
    "--kv-dtype",
    "--preset",
    "--host-budget",
    "--replicas",
    "--routing",
    "--device",
    "--speed",
    "--max-batched-tokens",
    "--max-num-seqs",
    "--workers",
    "--run",
    "--timing",
    "--format",
)


def test_replay_flags(tmp_path):
    """``replay`` (app/commands/replay.py, another issue's) on a three-request Mooncake trace."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {i}, "input_length": 1500, "output_length": 20, '
            f'"hash_ids": [0, {i + 1}, {i + 2}]}}\n'
            for i in range(3)
        )
    )
    base = ["replay", str(trace), "--workers", "1", "--quiet"]
    for flag in REPLAY_FLAGS:
        for value in HOSTILE:
            argv = [*base, flag, value]
            # read by the roofline timing only (refused without it)
            if flag in ("--device", "--speed", "--max-batched-tokens", "--max-num-seqs"):
                argv += ["--timing", "roofline"]
            code, _, err = call(argv)
            assert_clean(argv, code, err)
    for value in HOSTILE:  # the trace itself
        code, _, err = call(["replay", value, "--quiet"])
        assert_clean(["replay", value], code, err)


def hostile_files(tmp: Path) -> dict[str, str]:
    """Files a new user points kvscope at by mistake, by name."""
    good = tmp / "good.db"
    code, _, err = call(
        ["replay", str(Path(__file__).parent / "data" / "mooncake_conversation_head400.jsonl"),
         "--limit", "4", "--capacity", "1e5", "--eviction-policy", "lru", "--quiet",
         "--workers", "1", "--db", str(good)]
    )  # fmt: skip
    assert code == 0, err
    (tmp / "dir").mkdir()
    files = {
        "empty": b"",
        "garbage": b"not a database \xff\xfe\n" * 64,
        "truncated.db": good.read_bytes()[: 3 * 4096],
        "header.db": good.read_bytes()[:100],
        "non-utf8.jsonl": b'{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1]}\n'
        b"\xff\xfe\x00 garbage\n",
        "blank.jsonl": b"\n  \n\n",
        "list.json": b"[1, 2]",
        "partial.json": b'{"model_type": "llama", "num_attention_heads": 0, "hidden_size": 64}',
        "gguf.gguf": b"GGUF\x03\x00\x00\x00" + b"\x01" * 10,
    }
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    other = sqlite3.connect(tmp / "other.db")  # SQLite, not kvscope's
    other.execute("CREATE TABLE foo (x)")
    other.commit()
    other.close()
    old = Database(tmp / "old.db")  # kvscope's first schema
    migrate(old, 1)
    old.conn.close()
    newer = open_db(tmp / "newer.db")  # a later kvscope's
    newer.conn.execute("PRAGMA user_version = 99")
    newer.conn.close()
    names = [*files, "dir", "other.db", "old.db", "newer.db"]
    paths = {name: str(tmp / name) for name in names}
    paths["missing"] = str(tmp / "garbage" / "x.db")  # under a file: cannot exist
    return paths


def test_every_file_input_refuses_hostile_files_in_one_line(tmp_path):
    """Files of the wrong kind, wherever a command reads one; an output path that cannot
    be written, wherever one writes."""
    files = hostile_files(tmp_path)
    good = str(tmp_path / "good.db")
    for f in files.values():
        for argv in (
            ["runs", f],
            ["runs", "--db", f, "--json"],
            ["report", f, "-o", str(tmp_path / "r.html")],
            ["report", f, "--format", "mooncake", "-o", str(tmp_path / "m.jsonl")],
            ["replay", f, "--quiet", "--workers", "1", "--eviction-policy", "lru"],
            ["replay", f, "--format", "db", "--quiet"],
            ["simulate", "--trace", f, "--requests", "5"],
            ["calc", "--config", f],
            ["calc", "--gguf", f],
            ["info", "--model", f],
            ["run", "--headless", "--db", f, "--requests", "2", "--model", NO_MODEL],
            ["run", "--headless", "--workload", f, "--db", str(tmp_path / "w.db"),
             "--model", NO_MODEL],
        ):  # fmt: skip
            code, _, err = call(argv)
            assert_clean(argv, code, err)
    outputs = [str(tmp_path / "dir"), str(tmp_path / "garbage" / "sub" / "out.html")]
    trace = str(Path(__file__).parent / "data" / "mooncake_conversation_head400.jsonl")
    for out in outputs:
        for argv in (
            ["report", good, "-o", out],
            ["report", good, "--format", "mooncake", "-o", out],
            ["replay", trace, "--limit", "3", "--quiet", "--workers", "1", "--plot", out],
            ["simulate", "--requests", "5", "--plot", out],
        ):
            code, _, err = call(argv)
            assert_clean(argv, code, err)
            assert code == 2, argv
    # the config.json cases name what is wrong with the file
    for name, fragment in (
        ("dir", "cannot read"),
        ("non-utf8.jsonl", "cannot read"),
        ("list.json", "not a JSON object"),
        ("partial.json", "has no 'num_hidden_layers'"),
    ):
        code, _, err = call(["calc", "--config", files[name]])
        assert code == 2 and fragment in err, (name, err)


def test_replay_trace_lines_of_any_shape(tmp_path):
    """Hostile trace lines: refused in one line naming ``path:line``, or replayed. A length
    no model has is refused before its pages are built (10^13 tokens ran out of memory)."""
    mooncake = '{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": {h}}}'
    huge = 10**13
    lines = [
        (mooncake.format(t=0, i=huge, o=2, h="[1]"), "input_length"),
        (mooncake.format(t=0, i=50, o=huge, h="[1]"), "output_length"),
        ('{"prompt_token_ids": [1, 2], "max_tokens": 10000000000000}', "max_tokens"),
        ('{"prompt_len": 10000000000000}', "prompt_len"),
        (mooncake.format(t=-10, i=5000, o=2, h="[1]"), None),
        (mooncake.format(t=1e308, i=5000, o=2, h="[1]"), None),
        (mooncake.format(t=0, i=5000, o=0, h="[1]"), None),
        (mooncake.format(t=0, i=5000, o=1, h="[-3]"), None),
        (mooncake.format(t=0, i=5000, o=1, h="[1.5]"), None),
        (mooncake.format(t=0, i=5000, o=1, h='"1"'), None),
        (mooncake.format(t=0, i=5, o=1, h="[]"), None),
        ('{"prompt_token_ids": [], "max_tokens": 2}', None),
        ('{"prompt_token_ids": [-1, 5], "max_tokens": 2}', None),
        ('{"prompt_token_ids": "abc", "max_tokens": 2}', None),
        ('{"prompt": "text needs a tokenizer", "max_tokens": 2}', None),
        ("null", None),
        ('"a string"', None),
        ("{}", None),
    ]
    for i, (line, too_long) in enumerate(lines):
        path = tmp_path / f"t{i}.jsonl"
        path.write_text(line + "\n")
        for timing in ("sequential", "roofline"):
            argv = ["replay", str(path), "--quiet", "--workers", "1", "--eviction-policy", "lru",
                    "--capacity", "1e5", "--timing", timing]  # fmt: skip
            code, _, err = call(argv)
            assert_clean(argv, code, err)
            if too_long is not None:
                assert code == 2 and f"{path}:1: {too_long}" in err and "is above" in err, err


def test_dummy_weights_larger_than_memory_are_refused_before_the_draw(tmp_path):
    """``--load-format dummy`` draws a preset's weights in host memory on the CPU: a shape
    that cannot fit is refused in one line (it ended in an allocation error, or the OOM
    killer, partway through). info draws none: it describes the shape."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if total > 300 * 2**30:
        pytest.skip("this machine holds llama3-70b's fp32 weights")
    run = ["run", "--headless", "--requests", "1", "--db", str(tmp_path / "r.db")]
    shape = ["--model", "preset:llama3-70b", "--load-format", "dummy", "--weights-dtype", "fp32",
             "--device", "cpu"]  # fmt: skip
    for command in (["generate", "hi"], run):
        argv = [*command, *shape]
        code, _, err = call(argv)
        assert_clean(argv, code, err)
        assert code == 2 and "fp32 weights" in err and "more than this machine's memory" in err
    # info draws nothing with dummy weights (it sizes from the shape): it answers
    code, out, err = call(["info", *shape, "--json"])
    assert code == 0, err
    info = json.loads(out)
    assert info["params"] == 70_553_706_496 and info["weight_bytes"] == 4 * 70_553_706_496
