"""KernelTimer's bookkeeping with stand-in events (the real ones need CUDA): entries are
reported in order once their last event completes, spans sum, and ``wait`` drains all."""

from __future__ import annotations

import itertools

from kvscope.engine.kernel_timer import KernelTimer


class FakeEvent:
    """Records a fake GPU timestamp in ms; 'completes' when the test says the GPU got there."""

    clock = itertools.count(0, 2)  # each record() lands 2 ms after the previous one
    gpu_at = 0

    def record(self) -> None:
        self.t = next(FakeEvent.clock)

    def query(self) -> bool:
        return self.t <= FakeEvent.gpu_at

    def synchronize(self) -> None:
        FakeEvent.gpu_at = max(FakeEvent.gpu_at, self.t)

    def elapsed_time(self, end: FakeEvent) -> float:
        return float(end.t - self.t)


def test_entries_resolve_in_order_when_complete_and_all_when_waited():
    FakeEvent.clock, FakeEvent.gpu_at = itertools.count(0, 2), -1
    got: list[tuple] = []
    timer = KernelTimer(lambda *row: got.append(row), new_event=FakeEvent)
    for _ in range(3):  # three layers of one step: one entry, three spans
        with timer.span():
            pass
    timer.submit(7, "triton.paged_decode", "B=4", 10.0, 20.0)
    with timer.span():
        pass
    timer.submit(8, "graph.decode_step", "B=4", 1.0, 2.0)
    timer.submit(9, "nothing", "", 0.0, 0.0)  # no spans since the last submit: no entry
    assert timer.pending == 2

    assert timer.drain() == 0 and got == []  # the GPU has not reached any end event
    FakeEvent.gpu_at = 9  # past step 7's last end event (t=10 is not reached yet: still 9)
    assert timer.drain() == 0
    FakeEvent.gpu_at = 10
    assert timer.drain() == 1
    assert got == [(7, "triton.paged_decode", "B=4", 0.006, 10.0, 20.0)]  # 3 spans x 2 ms
    assert timer.drain(wait=True) == 1 and timer.pending == 0
    assert got[1] == (8, "graph.decode_step", "B=4", 0.002, 1.0, 2.0)
