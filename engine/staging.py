"""One host-to-device copy per step: a step's inputs staged in one pinned buffer.

Token ids, positions, the slot mapping, the logits rows and the CSR page
table are written section by section into one pinned host buffer and reach
the device with a single non-blocking copy into a device buffer of the same
layout; each section is then a typed view of it. (Seven pageable
``torch.tensor(..., device=cuda)`` per step were seven synchronising copies.)

On CUDA two host buffers alternate, so a step fills one while the previous
step's copy may still read the other; before refilling a buffer the host
waits on the event of the copy that last read it, two steps back (long done
in practice: every step that samples has already waited for its tokens).
On the CPU the host buffer is the device buffer and nothing is copied.
"""

from __future__ import annotations

import numpy as np
import torch

_ALIGN = 8  # every section starts on an 8-byte boundary, so any dtype views it
_NUMPY = {torch.int64: np.int64, torch.int32: np.int32}


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class StagingBuffer:
    """Typed sections in one host buffer, copied to the device once per ``commit``.

    ``fixed`` keeps the capacity (and so the device buffer's address) for good:
    what a captured CUDA graph reads; otherwise the buffer grows as steps need.
    """

    def __init__(self, nbytes: int, device: str | torch.device, fixed: bool = False) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.fixed = fixed
        self._count = 2 if self.cuda else 1
        self._events: list[torch.cuda.Event | None] = [None] * self._count
        self._which = 0
        self.used = 0
        self.copies = 0  # host-to-device copies made (one per commit on CUDA)
        self._allocate(_aligned(max(nbytes, _ALIGN)))

    def _allocate(self, nbytes: int) -> None:
        self.nbytes = nbytes
        host = [
            torch.zeros(nbytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(self._count)
        ]
        device = (
            torch.zeros(nbytes, dtype=torch.uint8, device=self.device) if self.cuda else host[0]
        )
        self._host = host
        # Whole-buffer typed views, made once: a section is then one slice of one of them.
        self._np = [{d: h.numpy().view(n) for d, n in _NUMPY.items()} for h in host]
        self._views = {d: device.view(d) for d in _NUMPY}
        self._device = device

    def begin(self, nbytes: int = 0) -> None:
        """Start a step that needs up to ``nbytes`` (a growable buffer grows to fit)."""
        self._which = (self._which + 1) % self._count
        event = self._events[self._which]
        if event is not None:
            event.synchronize()
        if nbytes > self.nbytes:
            assert not self.fixed, (
                f"{nbytes} bytes do not fit a fixed staging buffer of {self.nbytes}"
            )
            self._allocate(_aligned(max(nbytes, 2 * self.nbytes)))
        self.used = 0

    @staticmethod
    def section_bytes(*counts: tuple[int, torch.dtype]) -> int:
        """Bytes that sections of ``(count, dtype)`` take, alignment included."""
        return sum(_aligned(n * d.itemsize) for n, d in counts)

    def reserve(self, n: int, dtype: torch.dtype) -> int:
        """The offset of a new section of ``n`` values after the last one."""
        offset = self.used
        self.used = offset + _aligned(n * dtype.itemsize)
        assert self.used <= self.nbytes, "staging section past the buffer's end"
        return offset

    def host(self, offset: int, n: int, dtype: torch.dtype) -> np.ndarray:
        """The host section at ``offset``, as numpy, to fill in place."""
        first = offset // dtype.itemsize
        return self._np[self._which][dtype][first : first + n]

    def put(self, values: object, dtype: torch.dtype, offset: int | None = None) -> int:
        """Write ``values`` (a list or array) as a section; returns its offset."""
        n = len(values)  # type: ignore[arg-type]
        if offset is None:
            offset = self.reserve(n, dtype)
        self.host(offset, n, dtype)[:] = values
        return offset

    def view(self, offset: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """The device section at ``offset``: what the step's kernels read after ``commit``."""
        first = offset // dtype.itemsize
        return self._views[dtype][first : first + n]

    def commit(self, nbytes: int | None = None) -> None:
        """Copy the first ``nbytes`` (default: every section written) to the device, once,
        without the host waiting; kernels queued after it on this stream see the data."""
        if not self.cuda:
            return
        n = self.used if nbytes is None else nbytes
        self._device[:n].copy_(self._host[self._which][:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[self._which] = event
        self.copies += 1
