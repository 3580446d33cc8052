"""The kvscope inference engine: a Llama-family model over a paged KV cache.

The engine never imports the profiler, the database or the app; it only emits
events on an ``EventBus`` (engine/events.py).

On a 2-core machine torch's OpenMP workers spin-wait for a peer; when another
thread (the recorder, the UI) holds a core, a 2-thread GEMM becomes 20-40x
slower (measured: 57 ms -> 2 s per decode step). Passive waiting removes that
cliff at no cost here, so we default to it before torch is first imported.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
