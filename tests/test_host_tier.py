"""The host tier on the CPU: slot-major layout, one copy per run of slots, exact round trips
(the CUDA stream and event path runs the same copies, asynchronously)."""

from __future__ import annotations

import torch

from kvscope.engine.host_tier import HostTier, runs


def _pool(layers: int = 3, pages: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    data = torch.randn(layers, pages, 2, 4, 2, 8, generator=g)
    scales = torch.randn(layers, pages, 2, 4, 2, generator=g)  # int8/int4 pools carry these
    return [data, scales]


def test_runs_group_consecutive_slots():
    assert runs([4, 5, 6, 9, 10, 2]) == [(0, 4, 3), (3, 9, 2), (5, 2, 1)]
    assert runs([]) == []


def test_a_batch_of_pages_moves_in_one_copy_per_tensor_and_comes_back_exact():
    pool = _pool()
    original = [t.clone() for t in pool]
    host = HostTier(pool, 6)
    assert host.tensors[0].shape == (6, 3, 2, 4, 2, 8)  # slot-major: a slot is contiguous
    assert host.tensors[0][2].is_contiguous()
    slots, _ = host.store_many([5, 1, 3])
    assert slots == [0, 1, 2] and host.copies == 2  # one run, two tensors
    for t, o in zip(host.tensors, original, strict=True):
        assert torch.equal(t[slots].transpose(0, 1), o[:, [5, 1, 3]])
    for t in pool:
        t.zero_()
    host.load_many(slots, [7, 0, 2])
    for t, o in zip(pool, original, strict=True):
        assert torch.equal(t[:, [7, 0, 2]], o[:, [5, 1, 3]])
    assert host.num_free == 6


def test_slots_are_taken_as_a_consecutive_run_when_the_free_list_has_one():
    pool = _pool()
    host = HostTier(pool, 6)
    a, _ = host.store_many([0, 1])
    b, _ = host.store_many([2])
    host.load_many(a, [0, 1])  # slots 0 and 1 free again, 2 held
    copies = host.copies
    c, _ = host.store_many([3, 4, 5])
    assert b == [2] and c == [3, 4, 5] and host.copies - copies == 2
    d, _ = host.store_many([6, 7])
    assert d == [0, 1]
    host.check_integrity({*b, *c, *d})


def test_one_layer_is_read_without_freeing_the_slots():
    pool = _pool()
    original = pool[0].clone()
    host = HostTier(pool, 4)
    slots, _ = host.store_many([2, 6])
    pool[0].zero_()
    host.read(slots, [0, 1], layer=1)
    assert torch.equal(pool[0][1, [0, 1]], original[1, [2, 6]])
    assert pool[0][0].abs().sum() == 0 and pool[0][2].abs().sum() == 0  # other layers untouched
    host.wait_host(slots)  # nothing in flight on the CPU
    assert host.num_used == 2


def test_the_kv_manager_does_not_import_infllm():
    """InfLLM reaches the manager through a narrow interface; the import goes one way."""
    import subprocess
    import sys

    code = "import sys, kvscope.engine.kv_manager; print('kvscope.engine.infllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_replay_slot_tier_moves_batches_without_tensors():
    """The KV manager swaps through store_many/load_many; a replay's tier has no tensors."""
    from kvscope.engine.replay.host import SlotTier

    tier = SlotTier(4, page_copy_s=0.5)
    slots, seconds = tier.store_many([7, 8, 9])
    assert len(set(slots)) == 3 and seconds == 1.5 and tier.num_free == 1
    assert tier.load_many(slots, [1, 2, 3]) == 1.5
    assert (tier.num_free, tier.stores, tier.loads) == (4, 3, 3)
