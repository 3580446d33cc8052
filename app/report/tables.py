"""A run's tables as CSV files or one JSON document.

Both formats come from one list of tables, so they cannot disagree: the run's
summary, its requests, and every row of its steps, kernels, GPU samples and
events (payloads as JSON), each with ``t_s`` in seconds since the run's start.
A watched deployment (run kind ``watch``) has its own tables instead: sources,
blocks per source, duplication across replicas, shared prefixes and incidents.
Large tables stream from SQLite to the file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from kvscope.db import queries
from kvscope.db import watch_read as wq
from kvscope.db.formulas import KernelStat, RunSummary
from kvscope.db.queries import RequestRow, kernel_stats, requests_table, run_info, run_summary

Table = tuple[list[str], Iterable[tuple]]


def _dataclass_table(cls: type, items: list[Any]) -> Table:
    names = [f.name for f in fields(cls)]
    return names, (tuple(asdict(item).values()) for item in items)


def run_tables(db: Database, run_id: int) -> dict[str, Table]:
    """Every table of the run, by file stem; rows are produced lazily."""
    if run_info(db, run_id).kind == "watch":
        return watch_tables(db, run_id)
    tables = {
        "summary": _dataclass_table(RunSummary, [run_summary(db, run_id)]),
        "requests": _dataclass_table(RequestRow, requests_table(db, run_id)),
        "kernel_stats": _dataclass_table(KernelStat, kernel_stats(db, run_id)),
    }
    for name in ("steps", "kernels", "gpu_samples", "events"):
        tables[name] = queries.raw_rows(db, run_id, name)
    return tables


def watch_tables(db: Database, run_id: int) -> dict[str, Table]:
    """A watched deployment's tables, as its dashboard page shows them."""
    return {
        "watch_sources": _dataclass_table(wq.WatchSource, wq.watch_sources(db, run_id)),
        "watch_blocks": _dataclass_table(wq.BlockStats, wq.block_stats(db, run_id)),
        "watch_duplication": _dataclass_table(wq.Duplication, wq.duplication(db, run_id)),
        "watch_prefixes": _dataclass_table(wq.SharedPrefix, wq.prefix_tree(db, run_id)),
        "watch_incidents": _dataclass_table(wq.Incident, wq.incidents(db, run_id)),
        "watch_misses": _dataclass_table(wq.Misses, wq.misses(db, run_id)),
    }


def _cell(value: Any) -> Any:
    """A CSV cell: mappings and lists (a source's cached blocks by medium) as JSON."""
    return json.dumps(value) if isinstance(value, dict | list | tuple) else value


def write_csv(db: Database, run_id: int, directory: Path) -> list[Path]:
    """One CSV per table in ``directory`` (created); returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (columns, rows) in run_tables(db, run_id).items():
        path = directory / f"{name}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows([_cell(v) for v in row] for row in rows)
        written.append(path)
    return written


def _records(columns: list[str], rows: Iterable[tuple]) -> Iterator[dict[str, Any]]:
    for row in rows:
        record = dict(zip(columns, row, strict=True))
        if "payload" in record:
            record["payload"] = json.loads(record["payload"] or "{}")
        yield record


def json_document(db: Database, run_id: int) -> dict:
    """``{"run": ..., "tables": {name: [row objects]}}``."""
    return {
        "run": asdict(run_info(db, run_id)),
        "tables": {
            name: list(_records(columns, rows))
            for name, (columns, rows) in run_tables(db, run_id).items()
        },
    }


def write_json(db: Database, run_id: int, path: Path) -> Path:
    """``json_document`` in one file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        json.dump(json_document(db, run_id), f, separators=(",", ":"))
    return path
