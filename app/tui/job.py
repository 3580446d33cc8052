"""``kvscope run``'s engine workload as the TUI runs it: in a worker thread, until
done or until the event (the user quit) is set; it returns the run's summary."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Job = Callable[[threading.Event], "dict[str, Any] | None"]
