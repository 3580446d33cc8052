"""The allocation simulator: allocator invariants (hypothesis), replay figures, traces."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.engine.alloc_sim import (
    Arena,
    DoublingAllocator,
    MaxReservationAllocator,
    PagedAllocator,
    replay,
)
from kvscope.engine.errors import KvscopeError
from kvscope.engine.traces import TraceRequest, generate_trace, read_trace

CAPACITY = 16384


def _all_three(capacity: int = CAPACITY, page_size: int = 16, max_len: int = 2048):
    return [
        MaxReservationAllocator(capacity, max_len),
        DoublingAllocator(capacity),
        PagedAllocator(capacity, page_size),
    ]


@pytest.fixture(scope="module")
def default_results():
    trace = generate_trace()
    return {a.name: replay(trace, a, kv_bytes_per_token=131072) for a in _all_three()}


def test_paged_at_page_size_16_uses_at_least_96_percent_of_reserved_slots(default_results):
    paged = default_results["paged"]
    assert paged.utilization >= 0.96
    assert paged.external_fragmentation == 0
    assert paged.bytes_copied == 0


def test_doubling_wastes_about_a_quarter_inside_requests_and_fragments_between_them(
    default_results,
):
    doubling = default_results["doubling"]
    assert 0.65 <= doubling.utilization <= 0.80
    assert doubling.external_fragmentation > 0.02
    assert doubling.bytes_copied == doubling.tokens_copied * 131072 > 0
    assert doubling.memory_utilization < default_results["paged"].memory_utilization


def test_max_reservation_is_far_below_both_and_holds_a_fixed_batch(default_results):
    reserve = default_results["max_reservation"]
    assert reserve.utilization < 0.35
    assert reserve.utilization < default_results["doubling"].utilization - 0.3
    assert reserve.max_batch == CAPACITY // 2048
    assert reserve.preemptions == 0
    assert reserve.max_batch < default_results["doubling"].max_batch
    assert reserve.max_batch < default_results["paged"].max_batch
    assert reserve.steps > default_results["paged"].steps


def test_result_summary_is_a_plain_dict_without_the_timeline(default_results):
    summary = default_results["paged"].summary()
    assert "timeline" not in summary
    assert {"utilization", "max_batch", "external_fragmentation", "bytes_copied"} <= set(summary)
    assert all(isinstance(v, (int, float, str)) for v in summary.values())
    assert len(default_results["paged"].timeline.held) == summary["steps"]


# Each op: (kind, request id, prompt length); ids are reused so admits, appends
# and releases hit live and finished requests alike.
ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "append", "release"]), st.integers(0, 7), st.integers(1, 60)
    ),
    max_size=120,
)


MAKERS = {
    "max_reservation": lambda: MaxReservationAllocator(256, 64),
    "doubling": lambda: DoublingAllocator(256),
    "paged": lambda: PagedAllocator(256, 16),
}


@pytest.mark.parametrize("name", MAKERS)
@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_allocators_never_overlap_and_leak_nothing(name, ops):
    allocator = MAKERS[name]()
    for kind, rid, prompt in ops:
        live = rid in allocator.tokens
        if kind == "admit" and not live:
            allocator.admit(rid, prompt)
        elif kind == "append" and live and allocator.tokens[rid] < (allocator.max_tokens or 256):
            before = (dict(allocator.tokens), dict(allocator.slots))
            if not allocator.append(rid):
                assert (allocator.tokens, allocator.slots) == before  # refused: nothing changed
        elif kind == "release" and live:
            allocator.release(rid)
        allocator.check_integrity()
    for rid in list(allocator.tokens):
        allocator.release(rid)
    allocator.check_integrity()
    assert allocator.held == allocator.reserved == 0
    assert allocator.free_slots() == 256


traces = st.lists(
    st.builds(
        TraceRequest,
        st.integers(1, 40),
        st.integers(1, 40),
        st.floats(0, 2, allow_nan=False),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(trace=traces, page_size=st.sampled_from([1, 4, 16]))
def test_replay_finishes_every_request_and_frees_everything(trace, page_size):
    for allocator in _all_three(capacity=256, page_size=page_size, max_len=80):
        result = replay(trace, allocator, check_every_step=True)
        assert allocator.tokens == {} and allocator.held == allocator.reserved == 0
        assert allocator.free_slots() == 256
        timeline = result.timeline
        assert all(h <= r <= 256 for h, r in zip(timeline.held, timeline.reserved, strict=True))
        assert 0 < result.utilization <= 1
        assert result.max_batch <= len(trace)
        # Every output token is appended once, plus recomputation after preemption.
        assert result.steps >= max(r.output_len for r in trace) + 1


def test_arena_is_first_fit_and_coalesces_freed_neighbours():
    arena = Arena(100)
    a, b, c = arena.allocate(30), arena.allocate(30), arena.allocate(30)
    assert (a, b, c) == (0, 30, 60)
    arena.release(b, 30)
    assert arena.allocate(40) is None  # 40 free slots, but in holes of 30 and 10
    assert arena.allocate(20) == 30
    arena.release(30, 20)
    arena.release(a, 30)
    assert arena.holes == [(0, 60), (90, 10)]
    arena.release(c, 30)
    assert arena.holes == [(0, 100)] and arena.free == 100


def test_doubling_copies_the_held_tokens_on_every_growth():
    allocator = DoublingAllocator(64)
    result = replay([TraceRequest(3, 14)], allocator, kv_bytes_per_token=2)
    # reserved 4 at admission (3 tokens + the next), then 8, 16, 32: copies of 4 + 8 + 16
    assert result.tokens_copied == 28
    assert result.bytes_copied == 56
    assert max(result.timeline.reserved) == 32


def test_paged_internal_fragmentation_is_the_unfilled_last_page():
    allocator = PagedAllocator(1024, page_size=16)
    result = replay([TraceRequest(16, 20)], allocator)
    # admission reserves room for token 17 (2 pages); the 33rd token takes a third page
    assert result.timeline.held == list(range(16, 37))
    assert result.timeline.reserved == [32] * 17 + [48] * 4
    assert result.utilization == pytest.approx(sum(range(16, 37)) / (32 * 17 + 48 * 4))


def test_a_full_budget_preempts_the_newest_request_which_recomputes_later():
    allocator = PagedAllocator(64, page_size=16)
    result = replay([TraceRequest(16, 30), TraceRequest(16, 30)], allocator, check_every_step=True)
    assert result.preemptions >= 1
    assert result.recomputed_tokens > 0
    assert result.max_batch == 2


def test_idle_time_between_arrivals_is_skipped():
    trace = [TraceRequest(8, 4, 0.0), TraceRequest(8, 6, 100.0)]
    result = replay(trace, PagedAllocator(64, 16), step_s=0.025)
    assert result.steps == (4 + 1) + (6 + 1)
    assert result.max_waiting == 0


def test_requests_that_cannot_fit_are_rejected_with_their_index():
    with pytest.raises(KvscopeError, match="request 1 .*longer than the maximum length 64"):
        replay([TraceRequest(8, 8), TraceRequest(60, 10)], MaxReservationAllocator(256, 64))
    with pytest.raises(KvscopeError, match="needs 512 slots under doubling"):
        replay([TraceRequest(200, 100)], DoublingAllocator(300))


def test_sharegpt_like_trace_has_sharegpt_means_and_respects_max_length():
    trace = generate_trace("sharegpt", 2000, max_len=2048, seed=1)
    assert 130 < statistics.mean(r.prompt_len for r in trace) < 190
    assert 290 < statistics.mean(r.output_len for r in trace) < 390
    assert statistics.median(r.prompt_len for r in trace) < 161  # lognormal: long tail
    assert max(r.total_len for r in trace) <= 2048
    assert min(min(r.prompt_len, r.output_len) for r in trace) >= 1
    assert generate_trace("sharegpt", 50, seed=1) == trace[:50]


def test_fixed_and_uniform_traces_and_poisson_arrivals():
    assert set(generate_trace("fixed", 5, prompt_len=100, output_len=50)) == {TraceRequest(100, 50)}
    uniform = generate_trace("uniform", 3000, prompt_len=100, output_len=50, seed=2)
    assert 95 < statistics.mean(r.prompt_len for r in uniform) < 105
    assert max(r.prompt_len for r in uniform) <= 199
    arrivals = [r.arrival_s for r in generate_trace("fixed", 500, rate=10.0)]
    assert arrivals == sorted(arrivals) and 40 < arrivals[-1] < 60
    with pytest.raises(KvscopeError, match="unknown trace distribution 'zipf'"):
        generate_trace("zipf")


def test_jsonl_trace_reads_requests_and_skips_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt_len": 10, "output_len": 5}\n\n{"prompt_len": 3, "output_len": 2, "arrival_s": 1.5}\n'
    )
    assert read_trace(path) == [TraceRequest(10, 5), TraceRequest(3, 2, 1.5)]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "t.jsonl:2: not valid JSON"),
        ('{"prompt_len": 4}', "t.jsonl:2: missing 'output_len'"),
        ('{"prompt_len": -4, "output_len": 1}', "t.jsonl:2: prompt_len must be a positive integer"),
        (
            '{"prompt_len": 4.5, "output_len": 1}',
            "t.jsonl:2: prompt_len must be a positive integer",
        ),
        ('{"prompt_len": 4, "output_len": 1, "arrival_s": -1}', "t.jsonl:2: arrival_s must be"),
        ('{"prompt_len": 4, "output_len": 1, "arrival_s": NaN}', "finite number >= 0, got nan"),
        ('{"prompt_len": 4, "output_len": 1, "arrival_s": Infinity}', "finite number"),
        ("[1, 2]", "t.jsonl:2: expected a JSON object"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_len": 1, "output_len": 1}\n' + line + "\n")
    with pytest.raises(KvscopeError, match=message):
        read_trace(path)


def test_empty_or_missing_trace_files_are_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(KvscopeError, match="has no requests"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(KvscopeError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
