"""A new user's bad input to ``watch``, ``report`` and ``simulate``: each case had been a
traceback, a doubled count, an empty file or a silent exit 0, and is now one error line
(exit 2) before any work, or a complete result."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from kvscope.app.cli import main
from kvscope.profiler.watch.recorder import WatchRecorder

from support.installed import KVSCOPE


def refused(capsys, argv: list[str], *fragments: str) -> str:
    """Run ``argv``; assert exit 2 and one ``kvscope: error:`` line holding ``fragments``."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.startswith("kvscope: error: ") and err.count("\n") == 1, (argv, err)
    assert all(f in err for f in fragments), (argv, err)
    return err


# --- watch: endpoints ZMQ refuses, or takes and can never reach --------------------------


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--source", "tcp://127.0.0.1:0"], ["--source 'tcp://127.0.0.1:0'", "port out of range"]),
        (["--source", "ipc://"], ["--source 'ipc://'", "needs a path"]),
        (["--source", "inproc://"], ["--source 'inproc://'", "needs a name"]),
        (["--source", "tcp://a b:1"], ["'tcp://a b:1'", "space"]),
        (["--source", "tcp://h:\u0665\u0665\u0665\u0667"], ["needs a host and a port"]),
        (["--source", "tcp://h:1", "--replay", "ipc://"], ["--replay 'ipc://'", "needs a path"]),
        (["--listen", ""], ["--listen ''", "must start with tcp://"]),
        (["--listen", "tcp://127.0.0.1:0"], ["--listen", "port out of range"]),
    ],
)
def test_watch_refuses_endpoints_before_the_database(capsys, tmp_path, flags, fragments):
    """ZMQ's refusals (an empty ipc path, a space, Arabic-Indic digits in a port) came
    after the run was created, leaving a failed run each; port 0 recorded a complete run
    of nothing; ``--listen ''`` said "nothing to watch"."""
    db = tmp_path / "w.db"
    refused(capsys, ["watch", str(db), *flags, "--duration", "0.2"], *fragments)
    assert not db.exists()


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--source", "tcp://127.0.0.1:6001"] * 2, "--source tcp://127.0.0.1:6001 is given twice"),
        (
            [
                "--source",
                "tcp://127.0.0.1:6001",
                "--dp-size",
                "3",
                "--source",
                "tcp://127.0.0.1:6002",
            ],
            "both name tcp://127.0.0.1:6002",
        ),
        (
            ["--listen", "tcp://127.0.0.1:6001", "--source", "tcp://127.0.0.1:6001"],
            "both name tcp://127.0.0.1:6001",
        ),
    ],
)
def test_watch_refuses_an_endpoint_named_twice(capsys, tmp_path, flags, fragment):
    """Two subscriptions to one publisher had recorded each batch on two sources: block
    events doubled, and every block a false routing miss and a duplicated copy."""
    db = tmp_path / "w.db"
    refused(capsys, ["watch", str(db), *flags, "--duration", "0.2"], fragment)
    assert not db.exists()


def test_watch_refuses_a_dp_size_past_the_port_range_at_once(tmp_path):
    """ipc:// has no port range to stop it: 10^8 ranks had built specs for over a minute
    and 5 GB before anything was said (run apart, under a memory limit, so that a
    regression fails here instead of taking the machine's memory)."""
    import resource

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    db = tmp_path / "w.db"
    argv = ["watch", str(db), "--source", "ipc:///tmp/kvscope-x", "--dp-size", "100000000"]
    proc = subprocess.run(
        [KVSCOPE, *argv], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, preexec_fn=limit_memory,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("kvscope: error: --dp-size 100000000") and "65536" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not db.exists()


@pytest.mark.parametrize(
    ("flag", "url", "fragment"),
    [
        ("--metrics", "http://[::1/", "Invalid IPv6 URL"),  # had been a traceback
        ("--server-info", "http://[::1/", "Invalid IPv6 URL"),
        ("--metrics", "http://a b/metrics", "a space"),  # had killed the scraper's thread
        ("--metrics", "http://h:1/\x07", "a control character"),
    ],
)
def test_watch_refuses_urls_urllib_cannot_fetch(capsys, tmp_path, flag, url, fragment):
    argv = ["watch", str(tmp_path / "w.db"), "--source", "tcp://127.0.0.1:6001", flag, url]
    refused(capsys, [*argv, "--duration", "0.2"], flag, fragment)


def test_watch_scrape_interval_has_a_floor(capsys, tmp_path):
    """1e-9 had scraped in a busy loop: 7,761 requests in a second at the server."""
    argv = ["watch", str(tmp_path / "w.db"), "--source", "tcp://127.0.0.1:6001", "--duration"]
    refused(capsys, [*argv, "0.2", "--scrape-interval", "1e-9"], "--scrape-interval", "at least")


@pytest.mark.parametrize("value", ["-1h", "-30m", "-.5d", "-1e3", "-2.5D"])
def test_watch_a_negative_keep_raw_reaches_the_duration_check(capsys, tmp_path, value):
    """argparse had taken "-1h" for an option: "--keep-raw: expected one argument"."""
    db = tmp_path / "w.db"
    argv = ["watch", str(db), "--source", "tcp://127.0.0.1:6001", "--keep-raw", value]
    refused(capsys, argv, f"--keep-raw {value!r} must be a positive, finite duration")
    assert not db.exists()


def test_watch_a_negative_duration_with_a_unit_is_a_value_not_an_option(capsys, tmp_path):
    """--duration reads durations as --keep-raw does; "-5s" had been "not a number"."""
    argv = ["watch", str(tmp_path / "w.db"), "--source", "tcp://127.0.0.1:6001"]
    refused(capsys, [*argv, "--duration", "-5s"], "--duration '-5s' must be a positive, finite")
    refused(capsys, [*argv, "--duration", "5 min"], "--duration '5 min': give a duration such as")
    refused(capsys, [*argv, "--keep-raw", "--new-run"], "--keep-raw: expected one argument")


@pytest.mark.parametrize("value", ["-1h", "-1", "-x"])
def test_watch_a_database_named_like_an_option_is_refused(capsys, tmp_path, monkeypatch, value):
    """``kvscope watch -1h`` (meant for --keep-raw) must not create a file "-1h" and watch
    into it; ./-1h names such a file."""
    monkeypatch.chdir(tmp_path)
    argv = ["watch", value, "--source", "tcp://127.0.0.1:6001", "--duration", "1"]
    if value == "-x":
        refused(capsys, argv, "unrecognized arguments: -x")
    else:
        refused(capsys, argv, f"argument db: {value!r} looks like an option, not a database")
    assert list(tmp_path.iterdir()) == []


# --- report -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """Runs 1-3: a simulation's allocators; run 4: a watch (no sources, no events)."""
    path = tmp_path_factory.mktemp("sweep") / "two.db"
    assert main(["simulate", "--requests", "5", "--db", str(path), "--json"]) == 0
    recorder = WatchRecorder(path, {}, writer_process=False)
    recorder.start()
    recorder.finish()
    assert recorder.run_id == 4
    return path


def test_report_refuses_empty_and_dash_outputs(capsys, tmp_path, two_runs, monkeypatch):
    """``-o ''`` had been the current directory: --format csv wrote its files there, exit 0;
    ``-o -`` a file named '-'."""
    monkeypatch.chdir(tmp_path)
    for fmt in ("csv", "html", "json"):
        refused(capsys, ["report", str(two_runs), "--run", "1", "--format", fmt, "-o", ""], "-o")
        refused(capsys, ["report", str(two_runs), "--run", "1", "--format", fmt, "-o", "-"], "'-'")
    assert list(tmp_path.iterdir()) == []


def test_report_checks_its_output_before_building(capsys, tmp_path, two_runs, monkeypatch):
    """A directory given as the file, or a path under a file, is refused before the report
    is built; a failed write names the file (json and mooncake had said only the reason)."""
    import kvscope.app.report.html as html_report

    def never(*_):
        raise AssertionError("built a report it could not write")

    monkeypatch.setattr(html_report, "build_html", never)
    (tmp_path / "file").write_text("x")
    base = ["report", str(two_runs), "--run", "1"]
    refused(capsys, [*base, "-o", str(tmp_path)], "it is a directory")
    refused(capsys, [*base, "-o", str(tmp_path / "file" / "r.html")], "is a file, not a directory")
    # A mistyped directory is refused, not made (the whole tree had been, silently).
    missing = tmp_path / "no" / "such" / "dir" / "r.html"
    refused(capsys, [*base, "-o", str(missing)], f"no directory {missing.parent}")
    refused(capsys, [*base, "--format", "csv", "-o", str(missing.parent / "csv")], "no directory")
    assert not (tmp_path / "no").exists()
    if Path("/dev/full").exists():
        refused(capsys, [*base, "--format", "json", "-o", "/dev/full"], "cannot write /dev/full")


def test_report_never_writes_over_the_database_it_reports(capsys, tmp_path, two_runs):
    """``-o run.db`` had written the report over the recording, then died on a malformed
    database with a traceback: the run was gone. Its WAL files, a symlink to it and a
    hard link to it are the database too."""
    db = tmp_path / "run.db"
    db.write_bytes(two_runs.read_bytes())
    before = db.read_bytes()
    (tmp_path / "link.db").symlink_to(db)
    (tmp_path / "hard.db").hardlink_to(db)
    cases = [
        (db, db), (db, tmp_path / "run.db-wal"), (db, tmp_path / "run.db-shm"),
        (tmp_path / "link.db", db), (tmp_path / "hard.db", db), (db, tmp_path / "link.db"),
    ]  # fmt: skip
    for source, out in cases:
        for fmt in ("html", "json", "trace"):
            argv = ["report", str(source), "--run", "1", "--format", fmt, "-o", str(out)]
            refused(capsys, argv, f"cannot write {out}: it is the database being reported")
    assert db.read_bytes() == before
    assert main(["report", str(db), "--run", "1", "-o", str(tmp_path / "r.html")]) == 0


@pytest.mark.parametrize("fmt", ["trace", "mooncake"])
def test_report_of_a_watch_run_says_what_it_cannot_hold(capsys, tmp_path, two_runs, fmt):
    """A watch run's Perfetto trace had been three metadata events, exit 0."""
    out = tmp_path / f"w.{fmt}"
    refused(capsys, ["report", str(two_runs), "--run", "4", "--format", fmt, "-o", str(out)],
            "run 4 is a watch run", "html, csv or json")  # fmt: skip
    assert not out.exists()


# --- simulate --db ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["dir", "text.db", "missing/x.db", "text.db/x.db"])
def test_simulate_checks_its_database_before_simulating(capsys, tmp_path, bad):
    """The database had been opened after the simulation (a minute at 10^5 requests) and
    after --plot was written."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "text.db").write_text("hello\n")
    plot = tmp_path / "p.html"
    argv = ["simulate", "--requests", "5", "--plot", str(plot), "--db", str(tmp_path / bad)]
    refused(capsys, argv)
    assert not plot.exists()
    assert not (tmp_path / "missing").exists()


def test_simulate_records_every_step_of_a_long_simulation(capsys, tmp_path, monkeypatch):
    """The recorder is not started for a simulation, so its queue (200,000 events) had
    filled and dropped the rest: 614,261 of 814,260 steps at 20,000 requests. Here the
    queue is made small to see it at 40 requests."""
    import kvscope.app.sim_record as sim_record
    from kvscope.db import queries
    from kvscope.profiler.recorder import Recorder

    monkeypatch.setattr(sim_record, "Recorder", functools.partial(Recorder, max_queue=300))
    monkeypatch.setattr(sim_record, "WRITE_EVERY", 100)
    db = tmp_path / "sim.db"
    assert main(["simulate", "--requests", "40", "--db", str(db), "--json"]) == 0
    capsys.readouterr()
    for run in queries.list_runs(db):
        assert run.dropped_events == 0 and run.steps > 300, run
