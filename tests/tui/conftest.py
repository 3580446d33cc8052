"""The shared recorded database the TUI tests read (see tui_helpers.Recorded)."""

from __future__ import annotations

import pytest

from support.tui_helpers import Recorded


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return Recorded(tmp_path_factory.mktemp("tui") / "runs.db")
