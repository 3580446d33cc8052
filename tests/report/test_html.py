"""The HTML report: one self-contained file that draws its charts offline."""

from __future__ import annotations

import pytest

from kvscope.app.cli import main


@pytest.fixture(scope="module")
def html_report(synthetic_db, tmp_path_factory):
    path, run_id, _ = synthetic_db
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    return out


def test_the_file_references_nothing_outside_itself(html_report):
    text = html_report.read_text()
    assert "<script src" not in text and "<link" not in text


@pytest.mark.browser
def test_opens_offline_and_draws_every_chart(browser, html_report, synthetic_db):
    _, run_id, run = synthetic_db
    context = browser.new_context(offline=True)
    requests: list[str] = []
    context.route("**/*", lambda route: requests.append(route.request.url) or route.continue_())
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(html_report.as_uri())
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].every(g => g.querySelector('.main-svg .gtitle'))"
    )
    titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
    assert {"Throughput", "Page occupancy", "Time per kernel", "GPU samples"} <= set(titles)
    assert "Why prompt tokens missed the prefix cache" in titles
    assert len(titles) == 13
    assert page.locator("h1").inner_text() == f"kvscope run #{run_id}"
    tiles = dict(
        zip(
            page.locator(".tile-label").all_inner_texts(),
            page.locator(".tile-value").all_inner_texts(),
            strict=True,
        )
    )
    assert tiles["EVICTIONS"] == str(run.truth.evicted_pages)
    assert requests == [html_report.as_uri()]
    assert errors == []
    context.close()


def test_the_page_lists_every_request_with_its_figures(html_report, synthetic_db):
    """A per-request table: one row a request, with what the requests table says."""
    import re

    from kvscope.db.queries import requests_table

    path, run_id, _ = synthetic_db
    rows = requests_table(path, run_id)
    text = html_report.read_text()
    table = text[text.index("<h3>Requests</h3>") :].split("</table>")[0]
    assert len(re.findall("<tr>", table)) == 1 + len(rows) == 61  # the header, 60 requests
    first = rows[0]
    assert f"<td>{first.request_id}</td><td>{first.status}</td>" in table
    assert f"<td>{first.ttft_s:.3f}</td>" in table and f"<td>{first.prompt_tokens}</td>" in table


def test_unknown_run_and_missing_database_are_one_line(synthetic_db, tmp_path, capsys):
    path, _, _ = synthetic_db
    assert main(["report", str(path), "--run", "999"]) == 2
    assert capsys.readouterr().err.strip() == "kvscope: error: no run 999 in this database"
    assert main(["report", str(tmp_path / "none.db")]) == 2
    assert (
        capsys.readouterr().err.strip() == f"kvscope: error: no database at {tmp_path / 'none.db'}"
    )
