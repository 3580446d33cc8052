"""PNG screenshots of every dashboard page, taken in Debian's headless Chromium.

``main()`` writes screenshots/dash-<page>.png from a database (``--db``; by
default a demo database of two synthetic runs). The browser helpers here are
the ones the browser tests use, so screenshots and tests see the same pages.
Playwright's own browser download does not work on the project's machines: it
drives /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.app.dashboard.layout import PAGES
from kvscope.app.dashboard.server import Server, create_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
VIEWPORT = {"width": 1440, "height": 900}

# Synthetic runs claim the CPU preset so the roofline and cost model have
# ceilings to draw against (SmolLM2-135M's fp32 KV bytes per token and params).
DEMO_CONFIG = {
    "synthetic": True,
    "cost_device": "cpu",
    "kv_dtype": "fp32",
    "kv_bytes_per_token": 46080,
    "params": 134_515_008,
}


def launch(playwright: Any) -> Any:
    """Headless Debian Chromium under Playwright."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))


def wait_for_graphs(page: Any, timeout_ms: float = 20_000) -> int:
    """Wait until Dash has nothing loading and every graph has drawn a titled
    figure (an empty dcc.Graph draws axes but no title); returns the graph count."""
    page.wait_for_function(
        """() => {
            const graphs = document.querySelectorAll('.js-plotly-plot');
            return graphs.length > 0
                && !document.querySelector('[data-dash-is-loading="true"]')
                && [...graphs].every(g => g.querySelector('.main-svg .gtitle'));
        }""",
        timeout=timeout_ms,
    )
    return page.locator(".js-plotly-plot").count()


def demo_database(path: Path) -> list[int]:
    """Two synthetic runs that differ in one setting (host offload off, then on:
    the newest run, which pages show first, has every kind of event)."""
    from kvscope.profiler.synthetic import record_synthetic

    runs = []
    for seed, offload in ((2, False), (1, True)):
        config = DEMO_CONFIG | {"offload": offload, "seed": seed}
        run_id, _ = record_synthetic(
            path, config, num_requests=60, num_pages=96, offload=offload, gpu=offload, seed=seed
        )
        runs.append(run_id)
    return runs


def capture(
    db_path: Path,
    out_dir: Path,
    pages: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    prefix: str = "dash",
) -> list[Path]:
    """Serve ``db_path`` on a free local port and save each page (of ``pages``, all by
    default, less ``skip``) as ``{prefix}-{page}.png``, showing the newest run."""
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    server = Server(create_app(db_path, refresh_ms=60_000), port=0).start()
    written = []
    try:
        with sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
            for key, _, path in PAGES:
                if (pages and key not in pages) or key in skip:
                    continue
                page.goto(server.url.rstrip("/") + path)
                wait_for_graphs(page)
                if key == "requests":
                    page.locator("#requests-table input[type=radio]").nth(3).check()
                    page.wait_for_selector("#requests-detail .gtitle >> text=/Request \\d+/")
                page.wait_for_timeout(300)  # let transitions settle
                target = out_dir / f"{prefix}-{key}.png"
                page.screenshot(path=str(target), full_page=True)
                written.append(target)
            browser.close()
    finally:
        server.stop()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="database to show (default: a synthetic demo)")
    parser.add_argument("--out", type=Path, default=Path("screenshots"), help="output directory")
    parser.add_argument("--page", action="append", help="only this page (repeatable)")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        parser.error(f"{CHROMIUM} not found: apt-get install chromium (make browser)")
    with tempfile.TemporaryDirectory() as tmp:
        db_path = args.db
        if db_path is None:
            db_path = Path(tmp) / "demo.db"
            demo_database(db_path)
        for path in capture(db_path, args.out, args.page):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
