"""The installed ``kvscope`` command, as a user runs it: the entry point next to this Python.

Subprocess tests run it from their temporary directory, so nothing of the
repository is on the path: what they exercise is what ``pip install`` put in
the environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
