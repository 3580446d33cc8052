"""Fixtures for the dashboard tests: recorded synthetic runs with known contents,
and a headless Chromium (skipped, with the reason, only where it is absent)."""

from __future__ import annotations

import pytest

from app.dashboard.screenshots import CHROMIUM, DEMO_CONFIG, launch
from profiler.synthetic import record_synthetic


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    """(db path, run id, SyntheticRun): a run with offload, preemption and GPU samples."""
    path = tmp_path_factory.mktemp("dash") / "known.db"
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
