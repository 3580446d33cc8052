"""The issue's cosmetics: articles, the scored text's name, seconds past 1 s, plain --help texts,
the 80x24 help screen, and an SPDX license (no setuptools warnings)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from kvscope.app.cli import build_parser
from kvscope.app.dashboard import figures, infllm_figures, layout

ROOT = Path(__file__).resolve().parents[1]


def test_articles_and_the_scored_text():
    assert "is an engine run" in str(layout.not_applicable("watch", 3, "engine"))
    assert "is a simulation run" in str(layout.not_applicable("watch", 3, "simulation"))
    assert infllm_figures.request_label(-1) == "the scored text (eval perplexity)"
    assert infllm_figures.request_label(4) == "request 4"


def test_durations_in_seconds_past_one_second():
    assert figures._ms(6.8431) == "6.84 s"
    assert figures._ms(0.0123) == "12.3 ms"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_help_texts_have_no_raw_double_backticks():
    parsers = _parsers(build_parser())
    assert len(parsers) > 12  # every command and sub-command
    offenders = [p.prog for p in parsers if "``" in p.format_help()]
    assert not offenders, offenders


def test_license_is_an_spdx_string():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    requires = project["build-system"]["requires"]
    version = re.search(r"setuptools>=(\d+)", " ".join(requires))
    assert version and int(version.group(1)) >= 77, requires
