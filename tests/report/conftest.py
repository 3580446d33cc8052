"""Fixtures for the report tests: a recorded synthetic run with known contents."""

from __future__ import annotations

import pytest

from app.dashboard.screenshots import CHROMIUM, DEMO_CONFIG, launch
from profiler.synthetic import record_synthetic


@pytest.fixture(scope="session")
def report_db(tmp_path_factory):
    """(db path, run id, SyntheticRun) with offload, preemptions and GPU samples."""
    path = tmp_path_factory.mktemp("report") / "known.db"
    run_id, run = record_synthetic(
        path, DEMO_CONFIG, num_requests=60, num_pages=48, gpu=True, offload=True, seed=3
    )
    return path, run_id, run


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module: Playwright's sync API allows one at a time."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()
