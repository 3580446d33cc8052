"""The kvscope terminal UI (Textual): watch a run live, attach to a database, replay a run.

``run_tui`` is the one entry point: ``kvscope run`` calls it with the engine's
workload as ``job``; ``kvscope tui`` calls it without.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kvscope.app.tui.job import Job


def run_tui(
    db_path: str | os.PathLike[str],
    run_id: int | None = None,
    follow: bool = True,
    job: Job | None = None,
) -> dict[str, Any] | None:
    """Show a run in the terminal until the user quits; returns the job's result.

    Without ``job``: a viewer of ``db_path`` (the newest run, or ``run_id``),
    following the newest step when ``follow``, else opened paused at the run's
    last step for replay. With ``job(stop)``: the job runs in a worker thread and
    records into ``db_path``; the UI shows its run (the first run created after
    start, or ``run_id``) live, notes when it finishes and stays open until the
    user quits. Quitting earlier sets ``stop`` and waits for the job to return.
    A job's exception is re-raised here once the UI has closed.

    Raises KvscopeError (one line for the CLI) for a missing, empty or foreign
    database or an unknown run id, before the UI starts.
    """
    from kvscope.app.tui.app import KvscopeApp
    from kvscope.app.tui.data import check_database

    path = Path(db_path)
    check_database(path, run_id, missing_ok=job is not None, no_runs_ok=follow or job is not None)
    app = KvscopeApp(path, run_id=run_id, follow=follow, job=job)
    try:
        app.run()
    finally:
        if not app.detached:
            app.stop.set()
    if not app.job_started:
        return None
    if app.detached and not app.job_done.is_set():
        print(
            f"[kvscope] detached: the run continues headless into {path} "
            "(Ctrl-C stops it; its summary prints at the end)",
            file=sys.stderr,
        )
    try:
        app.job_done.wait()
    except KeyboardInterrupt:
        app.stop.set()  # the run stops and is marked interrupted, then the summary prints
        app.job_done.wait()
        raise
    if app.job_error is not None:
        raise app.job_error
    return app.job_result
