"""``kvscope watch`` from the command line: a recorded run, Ctrl-C, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvscope.app.cli import main
from kvscope.app.commands.watch import _line

from support.installed import KVSCOPE
from support.watch_helpers import free_port, wait_until
from support.watch_payloads import sglang_stored, vllm_stored


def test_watch_records_for_a_duration(tmp_path: Path, publishers, capsys) -> None:
    pub = publishers(replay_endpoint="tcp://127.0.0.1:*")

    def engine() -> None:
        pub.wait_for_subscribers()
        for h in range(5):
            pub.publish([vllm_stored([h, h + 100])])

    thread = threading.Thread(target=engine)
    thread.start()
    db = tmp_path / "w.db"
    code = main(
        ["watch", str(db), "--source", pub.endpoint, "--replay", pub.replay_endpoint,
         "--duration", "1.5s", "--json"]
    )  # fmt: skip
    thread.join()
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary = lines[-1]
    assert (summary["status"], summary["batches"], summary["block_events"]) == ("complete", 5, 10)
    assert all("block_events_per_s" in line for line in lines[:-1])
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT kind, status FROM runs").fetchall() == [("watch", "complete")]
    conn.close()


def test_ctrl_c_marks_the_run_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    proc = subprocess.Popen(
        [KVSCOPE, "watch", str(db), "--source",
         f"tcp://127.0.0.1:{free_port()}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    first = proc.stdout.readline()  # the banner: the run exists and the watch is live
    assert first.startswith("kvscope watch: run 1")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run 1 interrupted" in out
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    conn.close()


def test_sigterm_to_the_group_stops_like_ctrl_c(tmp_path: Path, publishers) -> None:
    """A supervisor's stop (systemd, docker: SIGTERM to every process of the group)
    reaches the writer process too; the watch still makes its last write and marks
    the run, and exits 143."""
    pub = publishers()
    db = tmp_path / "w.db"
    proc = subprocess.Popen(
        [KVSCOPE, "watch", str(db), "--source", pub.endpoint],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout.readline().startswith("kvscope watch: run 1")
    pub.wait_for_subscribers()
    for h in range(3):
        pub.publish([vllm_stored([h, h + 100])])
    conn = sqlite3.connect(db)
    wait_until(lambda: conn.execute("SELECT COUNT(*) FROM watch_blocks").fetchone()[0] == 3)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "run 1 interrupted" in out and "Traceback" not in err
    assert conn.execute("SELECT status, events_written FROM runs").fetchall() == [
        ("interrupted", 3)
    ]
    (blocks,) = conn.execute("SELECT SUM(blocks) FROM watch_blocks").fetchone()
    assert blocks == 6
    conn.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "http://x:1"], "must start with tcp://"),
        (
            ["--source", "tcp://h:1", "--replay", "tcp://h:2", "--replay", "tcp://h:3"],
            "one per source",
        ),
        (["--source", "tcp://h:1", "--metrics", "ftp://h/metrics"], "http:// or https://"),
        (["--source", "tcp://h:1", "--metrics", "http://"], "names no host"),
        (["--source", "tcp://h:1", "--metrics", "http://:9000/metrics"], "names no host"),
        (["--source", "tcp://h:1", "--metrics", "http://h:99999/metrics"], "out of range"),
        (["--source", "tcp://h:1", "--metrics", "http://h:x/metrics"], "integer"),
        ([], "give --source, --listen, --server-info or --metrics"),
        (["--source", "tcp://h:1", "--duration", "0"], "--duration '0' must be a positive"),
        (["--source", "tcp://h:1", "--dp-size", "0"], "at least 1"),
        (["--source", "tcp://h:1", "--keep-raw", "0"], "positive, finite duration"),
        (["--source", "tcp://h:1", "--keep-raw", "nan"], "positive, finite duration"),
        (["--source", "tcp://h:1", "--keep-raw", "a week"], "such as 90s, 30m"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys, args: list[str], message: str
) -> None:
    assert main(["watch", str(tmp_path / "w.db"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: error: ") and message in err and err.count("\n") == 1


def test_listen_on_a_busy_port_is_one_line(tmp_path: Path, publishers, capsys) -> None:
    busy = publishers("tcp://127.0.0.1:*").endpoint  # a publisher already bound there
    assert main(["watch", str(tmp_path / "w.db"), "--listen", busy, "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvscope: error: cannot listen on {busy}") and err.count("\n") == 1
    conn = sqlite3.connect(tmp_path / "w.db")
    assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
    conn.close()


def test_hundreds_of_dp_ranks_get_their_sockets(tmp_path: Path, capsys) -> None:
    """A SUB and a monitor per rank: past ZMQ's default of 1023 sockets a context (about
    500 ranks) the watch had ended in a traceback and then hung."""
    port = free_port()
    args = ["watch", str(tmp_path / "w.db"), "--source", f"tcp://127.0.0.1:{port}",
            "--dp-size", "700", "--duration", "0.5", "--json"]  # fmt: skip
    code = main(args)
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["sources"] == 700  # every socket opened
    # No engine there: none reached (a port of the 700 another test's publisher still
    # holds may have been: then the run is partial, with a warning).
    reached = 700 - summary["connecting"]
    assert (code, summary["status"]) == ((2, "failed") if not reached else (0, "partial"))
    assert "never connected to" in err and err.count("\n") == 1


def test_too_few_files_for_the_sources_is_one_line(tmp_path: Path) -> None:
    """With the open-file limit too low for the sockets (and no room to raise it), one
    error line and a failed run, not a traceback and a hang in the context's term."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    db = tmp_path / "w.db"
    proc = subprocess.run(
        [KVSCOPE, "watch", str(db), "--source",
         f"tcp://127.0.0.1:{free_port()}", "--dp-size", "1000", "--duration", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=low_limit,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kvscope: error: cannot open the sockets of 1000 sources")
    assert "ulimit -n" in proc.stderr and proc.stderr.count("\n") == 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
    conn.close()


def test_sglang_server_info_discovery_end_to_end(tmp_path: Path, publishers, capsys) -> None:
    pub = publishers("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    port = int(pub.endpoint.rsplit(":", 1)[1])
    replay_port = int(pub.replay_endpoint.rsplit(":", 1)[1])
    info = {
        "model_path": "m",
        "kv_events": {
            "endpoint_host": "*",
            "endpoint_port_base": port,
            "topic": "",
            "block_size": 4,
            "dp_size": 1,
            "replay_endpoint_port_base": replay_port,
        },
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(info).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def engine() -> None:
        pub.wait_for_subscribers()
        pub.publish([sglang_stored([-5, 6])])

    thread = threading.Thread(target=engine)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/server_info"
    db = tmp_path / "w.db"
    try:
        code = main(["watch", str(db), "--engine", "sglang", "--server-info", url,
                     "--duration", "1.5", "--json"])  # fmt: skip
    finally:
        thread.join()
        server.shutdown()
        server.server_close()
    assert code == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["batches"], summary["block_events"]) == (1, 2)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT engine, endpoint, replay FROM watch_sources").fetchall() == [
        ("sglang", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}")
    ]
    conn.close()


def test_keep_raw_durations() -> None:
    from kvscope.app.commands.watch import parse_duration

    assert [parse_duration(t, "--keep-raw") for t in ("90", "90s", "30m", "12h", "7d")] == [
        90,
        90,
        1800,
        43200,
        604800,
    ]


def test_a_source_never_reached_makes_the_run_partial(tmp_path: Path, publishers, capsys) -> None:
    """ZMQ retries a connection quietly: a port nobody publishes on had looked like an
    idle engine. Of 4 sources, 1 a wrong port: the live line says it is connecting
    within 2 s, the run ends partial with one warning line; the idle ones that did
    connect are no warning."""
    nobody = f"tcp://127.0.0.1:{free_port()}"
    idle = [publishers().endpoint for _ in range(3)]
    db = tmp_path / "w.db"
    args = ["watch", str(db), "--source", nobody, *(a for e in idle for a in ("--source", e)),
            "--duration", "2.5", "--json"]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    first = next(line for line in lines if "elapsed_s" in line)
    assert first["elapsed_s"] <= 2.0
    assert (first["connecting"], first["connecting_to"]) == (1, [nobody])
    assert lines[-1]["status"] == "partial" and lines[-1]["connecting_to"] == [nobody]
    assert err.startswith(f"kvscope: warning: never connected to {nobody}: ")
    assert err.count("\n") == 1 and not any(e in err for e in idle)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchall() == [("partial",)]
    conn.close()
    line = _line(SimpleNamespace(**(lines[1] | {"connecting": 2})))
    assert f"connecting to {nobody} and 1 more" in line


def test_a_watch_that_reached_no_source_fails(tmp_path: Path, capsys) -> None:
    """A mistyped endpoint had recorded a complete run of nothing, and said so only in a
    warning: it fails, with one error line, and the run is marked failed."""
    nobody = f"tcp://127.0.0.1:{free_port()}"
    db = tmp_path / "w.db"
    assert main(["watch", str(db), "--source", nobody, "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvscope: error: watch failed: never connected to {nobody}: ")
    assert err.count("\n") == 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
    conn.close()


def test_a_metrics_only_watch_scrapes_and_records(tmp_path: Path, metrics_server, capsys) -> None:
    """Scraping /metrics alone is a real use (no KV events published): a watch of
    --metrics only records its samples, with no event source, and ends complete."""
    url, _ = metrics_server
    db = tmp_path / "w.db"
    code = main(["watch", str(db), "--metrics", url, "--scrape-interval", "0.1",
                 "--duration", "1.2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "scraping 1 /metrics URL(s), no event source" in out
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status, model FROM runs").fetchall() == [("complete", "m")]
    assert conn.execute("SELECT kind, endpoint FROM watch_sources").fetchall() == [("metrics", url)]
    values = [v for (v,) in conn.execute("SELECT value FROM watch_metrics WHERE name = "
                                         "'vllm:num_requests_running' ORDER BY ts_ns")]  # fmt: skip
    conn.close()
    assert len(values) >= 5 and values == list(range(len(values)))  # one a scrape, in order
