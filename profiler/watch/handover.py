"""A flush's chunk handed to the writer process through shared memory, not the pipe.

A prefill-like chunk is ~6 MB of marshalled rows. Through the pipe, the writer
process (the watch's bound, ``profiler.watch.writer_process``) paid for it
between two writes: waiting while the watching process pushed it through the
socket's ~200 KB buffer, then copying it out (5-10 ms a chunk, ~5 % of its time).
Here the watching process copies the chunk into one of two shared-memory slots
while the writer is still writing the chunk before, and sends only the slot's
name and the length; the writer reads the rows straight out of the slot.

The watching process owns the slots (creates, grows and unlinks them); a slot
is reused only once the chunk it held is answered for (written or failed),
which the writer does after reading it out. The writer only attaches.
"""

from __future__ import annotations

import marshal
import os
from multiprocessing import shared_memory

INLINE_MAX = 1 << 18  # bytes: a message up to this size goes through the pipe itself
SLOTS = 2  # one being read out or written, one filled meanwhile


class SlotWriter:
    """The watching process's side: ``SLOTS`` buffers, each grown as chunks need."""

    def __init__(self) -> None:
        self._shm: list[shared_memory.SharedMemory | None] = [None] * SLOTS
        self.next = 0  # the slot the next chunk goes to

    def put(self, slot: int, data: bytes) -> tuple[str, int]:
        """Copy ``data`` into ``slot`` (free: its last chunk answered for) and make the
        other slot the next; returns the (name, length) the reader needs. Raises
        OSError when shared memory cannot be had (a full /dev/shm): the caller sends
        the chunk through the pipe instead."""
        shm = self._shm[slot]
        if shm is None or shm.size < len(data):
            self._drop(slot)
            # Room for a quarter more: chunks grow with the backlog, a slot seldom does.
            shm = _reserved(max(1 << 20, len(data) * 5 // 4))
            self._shm[slot] = shm
        shm.buf[: len(data)] = data
        self.next = (slot + 1) % SLOTS
        return shm.name, len(data)

    def _drop(self, slot: int) -> None:
        shm, self._shm[slot] = self._shm[slot], None
        if shm is not None:
            shm.close()
            try:
                shm.unlink()  # the reader's mapping stays valid until it lets go of it
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for slot in range(SLOTS):
            self._drop(slot)


class SlotReader:
    """The writer process's side: the slots attached by name, as they come."""

    def __init__(self) -> None:
        self._shm: list[shared_memory.SharedMemory | None] = [None] * SLOTS

    def read(self, slot: int, name: str, length: int) -> object:
        """The message marshalled into ``slot``; a new name is a slot the watching
        process grew: the old one is let go of."""
        shm = self._shm[slot]
        if shm is None or shm.name != name:
            if shm is not None:
                shm.close()
            shm = self._shm[slot] = _attach(name)
        with shm.buf[:length] as view:
            return marshal.loads(view)

    def unlink(self) -> None:
        """The watching process is gone: unlink the slots it owned here, rather than
        leave them to the resource tracker, which warns of a leak as it does so."""
        for shm in self._shm:
            if shm is not None:
                shm.close()
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
        self._shm = [None] * SLOTS


def _reserved(size: int) -> shared_memory.SharedMemory:
    """A new segment whose memory is taken now: a tmpfs /dev/shm (64 MB in a default
    docker container) hands out a segment of any size and answers writing past its
    room with SIGBUS, which would kill the watch; reserved up front, a full one is
    an OSError here instead, and the chunk goes through the pipe."""
    shm = shared_memory.SharedMemory(create=True, size=size)
    fd = getattr(shm, "_fd", -1)
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            shm.close()
            shm.unlink()
            raise
    return shm


def _attach(name: str) -> shared_memory.SharedMemory:
    """The slot by name. Python before 3.13 registers it with the resource tracker on
    attach too; the writer process shares the watching process's tracker (spawn
    hands it over), where a name is held once, and the owner's unlink clears it."""
    return shared_memory.SharedMemory(name=name)
