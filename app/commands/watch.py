"""``kvscope watch``: record a running vLLM or SGLang deployment's KV-cache events
and /metrics into a kvscope database, live, until Ctrl-C or ``--duration``."""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from kvscope.app.sizing_args import positive
from kvscope.engine.errors import KvscopeError

DEFAULT_LISTEN = "tcp://127.0.0.1:5557"
MIN_SCRAPE_INTERVAL_S = 0.1


def scrape_interval(text: str) -> float:
    """``--scrape-interval``: at least 0.1 s. 1e-9 had scraped in a busy loop, thousands
    of requests a second at the engine's server, a core of this machine spent on it."""
    value = positive(text)
    if value < MIN_SCRAPE_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_SCRAPE_INTERVAL_S} s, got {text}")
    return value


def database(text: str) -> Path:
    """The positional DB, which a negative-looking value (``-1h``) can reach now that it is
    read as a value: a name starting with "-" is a mistyped option (``kvscope watch -1h``,
    meant for --keep-raw), not a file to create and record into."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"{text!r} looks like an option, not a database; for a file of that name: ./{text}"
        )
    return Path(text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="record a vLLM or SGLang deployment's KV-cache events and /metrics, live",
        description=__doc__,
    )
    # argparse takes "-1h" for an option (only "-1" and "-1.5" read as negative numbers),
    # so "--keep-raw -1h" had said "expected one argument"; read as a value, the duration
    # parser says what is wrong with it. No watch option looks like a number.
    p._negative_number_matcher = NEGATIVE_VALUE
    p.add_argument(
        "db", nargs="?", type=database, help="the database (default: $KVSCOPE_DB or ./kvscope.db)"
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="an engine's event endpoint, e.g. tcp://gpu-node-1:5557 or ipc:///tmp/kv (repeatable)",
    )
    p.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="the replay endpoint of each --source, in the same order (then of --listen)",
    )
    p.add_argument("--topic", default="", help="the topic the engines publish on (default: all)")
    p.add_argument(
        "--dp-size",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel ranks behind each endpoint: rank r on port base+r (ipc: _dp{r})",
    )
    p.add_argument("--engine", choices=("vllm", "sglang"), default="vllm", help="the engine kind")
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a Prometheus /metrics URL to scrape (repeatable)",
    )
    p.add_argument(
        "--scrape-interval",
        type=scrape_interval,
        default=1.0,
        metavar="S",
        help="seconds between /metrics scrapes (default 1, at least 0.1)",
    )
    p.add_argument(
        "--server-info",
        action="append",
        default=[],
        metavar="URL",
        help="an SGLang /server_info URL: take the event endpoints it advertises",
    )
    p.add_argument(
        "--listen",
        nargs="?",
        const=DEFAULT_LISTEN,
        metavar="ENDPOINT",
        help=f"bind a subscriber that engines connect to (vLLM fan-in; default {DEFAULT_LISTEN})",
    )
    p.add_argument(
        "--duration",
        metavar="DURATION",
        help="stop after this long (90s, 30m, 12h, 7d; plain numbers are seconds)",
    )
    p.add_argument(
        "--keep-raw",
        metavar="DURATION",
        help="keep raw block events only this long (90s, 30m, 12h, 7d; plain numbers are "
        "seconds): a week-long watch's file stays bounded, and every view still shows "
        "the whole watch from its aggregates",
    )
    p.add_argument(
        "--new-run",
        action="store_true",
        help="start a new run even if the file holds a watch of the same sources "
        "(by default that watch resumes, after the last batch it recorded)",
    )
    p.add_argument("--json", action="store_true", help="status and summary as JSON lines")
    p.set_defaults(handler=run)


def _specs(args: argparse.Namespace) -> list:
    from kvscope.profiler.watch.discovery import discover
    from kvscope.profiler.watch.sources import expand_sources

    listen_replay = None
    if args.listen is not None and len(args.replay) == len(args.source) + 1:
        listen_replay = args.replay.pop()
    if args.replay and len(args.replay) != len(args.source):
        raise KvscopeError(
            f"{len(args.replay)} --replay for {len(args.source)} --source: give one per source"
        )
    groups = []  # (the flag and value that named them, their specs)
    for i, endpoint in enumerate(args.source):
        specs = expand_sources(
            endpoint,
            replay=args.replay[i] if args.replay else None,
            topic=args.topic,
            dp_size=args.dp_size,
            engine=args.engine,
            flag="--source",
        )
        groups.append((f"--source {endpoint}", specs))
    if args.listen is not None:
        specs = expand_sources(
            args.listen,
            replay=listen_replay,
            topic=args.topic,
            dp_size=args.dp_size,
            engine=args.engine,
            listen=True,
            flag="--listen",
        )
        groups.append((f"--listen {args.listen}", specs))
    for url in args.server_info:
        _check_url(url, "--server-info")
        groups.append((f"--server-info {url}", discover(url)))
    _check_distinct(groups)
    specs = [spec for _, group in groups for spec in group]
    if not specs and not args.metrics:
        raise KvscopeError("nothing to watch: give --source, --listen, --server-info or --metrics")
    return specs  # none: a scrape-only watch of --metrics


def _check_distinct(groups: list) -> None:
    """Each endpoint once: a --source given twice, or two whose DP ranks overlap
    (5557 with --dp-size 3, and 5558), had recorded every batch of the shared ports on
    two sources: block events doubled, and each block a false routing miss and a
    duplicated copy, with nothing said."""
    named: dict[str, int] = {}  # endpoint -> the group that named it first
    for i, (label, specs) in enumerate(groups):
        for spec in specs:
            first = named.setdefault(spec.endpoint, i)
            if first == i:
                continue
            earlier = groups[first][0]
            which = (
                f"{label} is given twice"
                if earlier == label
                else f"{earlier} and {label} both name {spec.endpoint}"
            )
            raise KvscopeError(
                f"{which}: each endpoint is watched once (its batches would be recorded twice)"
            )


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A negative number, with an exponent or a duration's unit: -1, -.5, -1e3, -1h, -2.5D.
NEGATIVE_VALUE = re.compile(
    rf"-(\d+\.?\d*|\.\d+)(e[+-]?\d+)?[{''.join(DURATION_UNITS)}]?$", re.IGNORECASE
)


MAX_DURATION_S = 3650 * 86400.0


def parse_duration(text: str, flag: str) -> float:
    """``90``, ``90s``, ``30m``, ``12h``, ``7d`` as seconds (positive and finite)."""
    value = text.strip().lower()
    scale = DURATION_UNITS.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise KvscopeError(
            f"{flag} {text!r}: give a duration such as 90s, 30m, 12h or 7d"
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise KvscopeError(f"{flag} {text!r} must be a positive, finite duration")
    if seconds > MAX_DURATION_S:
        # Durations become int nanoseconds downstream; 1e308 s would overflow there.
        raise KvscopeError(f"{flag} {text!r} is longer than the most kvscope takes (3650d)")
    return seconds


def _check_url(url: str, flag: str) -> None:
    """Refuse what urllib would refuse only at the first fetch: there, a space in the URL
    (http.client.InvalidURL) had ended the scraper's thread with a traceback and the watch
    had gone on with no scrapes and no scrape errors, and exited 0."""
    if not url.startswith(("http://", "https://")):
        raise KvscopeError(f"{flag} {url!r} must be an http:// or https:// URL")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise KvscopeError(f"{flag} {url!r} has a space or a control character in it")
    try:
        parts = urllib.parse.urlsplit(url)  # raises for a bracket left open: http://[::1/
        port = parts.port  # raises for a port that is not a number below 65536
    except ValueError as exc:
        raise KvscopeError(f"{flag} {url!r}: {exc}") from None
    if not parts.hostname:
        raise KvscopeError(f"{flag} {url!r} names no host")
    if port == 0:
        raise KvscopeError(f"{flag} {url!r}: port 0")


def _line(status, rate: float | None = None) -> str:
    """The live status line: totals, then what went wrong as it happens."""
    parts = [f"{status.sources} source{'' if status.sources == 1 else 's'}"]
    if rate is not None:
        parts.append(f"{rate:,.0f} block events/s")
    parts += [
        f"{status.block_events:,} block events",
        f"{status.batches:,} batches",
        f"gaps {status.gaps} (recovered {status.recovered_batches} batches, "
        f"lost {status.lost_batches})",
        f"restarts {status.restarts}",
    ]
    if status.bad_messages:
        parts.append(f"bad messages {status.bad_messages} ({_short(status.bad_message)})")
    parts.append(f"scrapes {status.scrapes}")
    if status.scrape_errors:
        failing = f": {_short(status.scrape_error)}" if status.scrape_error else ""
        parts.append(f"scrape errors {status.scrape_errors}{failing}")
    if status.queued:
        parts.append(f"queue {status.queued:,} batches, lag {status.lag_s:.1f} s")
    if status.connecting:
        more = f" and {status.connecting - 1} more" if status.connecting > 1 else ""
        parts.append(f"connecting to {status.connecting_to[0]}{more}")
    return "  ".join(parts)


def _live(line: str, tty: bool) -> str:
    """The line as printed: on a terminal it overwrites the previous one, and
    ``\x1b[K`` clears what a longer previous line left behind."""
    return f"\r{line}\x1b[K" if tty else line


def _short(text: str | None, width: int = 60) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _stop(session, final: str):
    """Stop the session; a second Ctrl-C or SIGTERM must not cut its last write short."""
    if threading.current_thread() is not threading.main_thread():
        return session.stop(final)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return session.stop(final)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a supervisor's stop: systemd, docker, kill): stopped as Ctrl-C stops
    it, with the last write made and the run marked, instead of dying mid-write
    with the run left 'running' and the writer process killed with it."""


def _terminate(signum, frame) -> None:
    raise _Terminated


def _on_sigterm():
    """Install ``_terminate`` (main thread only); returns what to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate)


def _unreached_text(never: list[str]) -> str:
    which = never[0] if len(never) == 1 else f"{len(never)} sources ({never[0]}, ...)"
    return (
        f"never connected to {which}: is an engine publishing KV events there (vLLM "
        "--kv-events-config, SGLang --kv-events-config)?"
    )


def _ending(session, final: str, metrics: bool) -> tuple[str, str | None]:
    """The run's status once stopped, and why it failed: ZMQ retries a connection
    quietly, so a typo'd host or port, or an engine without KV events on, had looked
    like an idle engine (a complete run of nothing). A watch that reached none of its
    sources (and scraped nothing) failed; one that missed some is partial."""
    from kvscope.db.schema import COMPLETE, FAILED, PARTIAL
    from kvscope.profiler.watch.session import unreached

    streams = session.subscriber.streams
    never = unreached(streams)
    if final != COMPLETE or not never:
        return final, None
    reached = [s for s in streams if s.spec.endpoint not in never]
    if not reached and not metrics:
        return FAILED, _unreached_text(never)
    return PARTIAL, None


def run(args: argparse.Namespace) -> int:
    from kvscope.db.schema import COMPLETE, FAILED, INTERRUPTED
    from kvscope.db.store import default_db_path
    from kvscope.profiler.watch.session import WatchSession, unreached

    for url in args.metrics:
        _check_url(url, "--metrics")
    keep_raw_s = None if args.keep_raw is None else parse_duration(args.keep_raw, "--keep-raw")
    duration_s = None if args.duration is None else parse_duration(args.duration, "--duration")
    specs = _specs(args)
    config = {
        "sources": [spec.endpoint for spec in specs],
        "metrics": args.metrics,
        "engine": args.engine,
        "topic": args.topic,
        "dp_size": args.dp_size,
    }
    session = WatchSession(
        args.db or default_db_path(),
        specs,
        metrics_urls=tuple(args.metrics),
        engine=args.engine,
        scrape_interval_s=args.scrape_interval,
        config=config,
        keep_raw_s=keep_raw_s,
        freeze_gc=True,  # this process is the watch's own
        resume=not args.new_run,
    ).start()
    tty = sys.stdout.isatty() and not args.json
    started = last_t = time.monotonic()
    last_blocks = 0
    final = COMPLETE
    terminated = False
    previous_term = _on_sigterm()
    try:
        if not args.json:
            resumed = " (resumed)" if session.recorder.resumed else ""
            what = (
                f"{len(specs)} source(s)"
                if specs
                else f"scraping {len(args.metrics)} /metrics URL(s), no event source"
            )
            print(
                f"kvscope watch: run {session.run_id}{resumed}, {what}; Ctrl-C to stop", flush=True
            )
        while duration_s is None or time.monotonic() - started < duration_s:
            left = 1.0 if duration_s is None else duration_s - (time.monotonic() - started)
            time.sleep(max(0.0, min(1.0, left)))
            if session.error is not None:
                final = FAILED
                break
            now, status = time.monotonic(), session.status()
            rate = (status.block_events - last_blocks) / max(now - last_t, 1e-9)
            last_t, last_blocks = now, status.block_events
            if args.json:
                print(
                    json.dumps(
                        {"elapsed_s": round(now - started, 3), "block_events_per_s": round(rate)}
                        | status.as_dict()
                    ),
                    flush=True,
                )
            else:
                print(_live(_line(status, rate), tty), end="" if tty else "\n", flush=True)
    except KeyboardInterrupt as exc:
        final, terminated = INTERRUPTED, isinstance(exc, _Terminated)
    except BaseException:
        _stop(session, FAILED)
        raise
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    final, unreachable = _ending(session, final, bool(args.metrics))
    status = _stop(session, final)
    if final != FAILED and session.error is not None:
        final = FAILED  # the last write failed: the run is marked failed, not what was asked
    summary = {"run_id": session.run_id, "status": final} | status.as_dict()
    if args.json:
        print(json.dumps(summary))
    else:
        print(("\n" if tty else "") + f"run {session.run_id} {final}: " + _line(status))
    if unreachable is not None:
        raise KvscopeError(f"watch failed: {unreachable}")
    if status.connecting:
        never = unreached(session.subscriber.streams)
        print(f"kvscope: warning: {_unreached_text(never)}", file=sys.stderr)
    if final == FAILED:
        raise KvscopeError(f"watch stopped: {session.error}")
    if final == INTERRUPTED:
        return 143 if terminated else 130  # 128 + the signal, as a shell reports it
    return 0
