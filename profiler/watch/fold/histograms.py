"""The fold's durations binned for ``watch_histograms``: a whole write's worth at
once, in numpy (four bins per octave of milliseconds, ``db.watch_aggregates.bin_of``)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from kvscope.db.watch_aggregates import BINS_PER_OCTAVE, HISTOGRAMS

if TYPE_CHECKING:
    from kvscope.profiler.watch.fold.source_cache import SourceCache

SPAN_HISTOGRAMS = ("lifetime", "idle_before_evict")  # what SourceCache.spans adds to
_BIN_KEYS = 256  # above any bin of an int64 of ns (2^63 ns is in bin 173)


def histogram_rows(sources: dict[int, SourceCache]) -> list[tuple]:
    """(source, histogram, bin, count) of every source's durations since the last
    write (taken from them), binned and counted in one numpy pass for the whole
    fleet: per source and histogram it had been a dozen numpy calls each, most of a
    write's time with 64 sources."""
    spans: list[tuple[int, list[int]]] = []  # every source's, with ...
    span_sources: list[int] = []  # ... its source, per span
    flat: list[int] = []  # every other duration, with ...
    flat_keys: list[int] = []  # ... its (source, histogram) as source * kinds + histogram
    kinds = len(HISTOGRAMS)
    for i, s in sources.items():
        if s.spans:
            spans += s.spans
            span_sources += [i] * len(s.spans)
            s.spans = []
        for h, durations in enumerate(s.hist.values()):  # in HISTOGRAMS order
            if durations:
                flat += durations
                flat_keys += [i * kinds + h] * len(durations)
                durations.clear()
    rows = []
    if spans:  # a span's blocks' lifetimes are also their idle times before eviction
        lengths, durations_ns = _span_durations(spans)
        keys = np.repeat(np.asarray(span_sources, np.int64), lengths)
        for key, n in _counted(keys * _BIN_KEYS + _bins(durations_ns)):
            source, b = divmod(key, _BIN_KEYS)
            rows += [(source, name, b, n) for name in SPAN_HISTOGRAMS]
    if flat:
        keys = np.asarray(flat_keys, np.int64)
        for key, n in _counted(keys * _BIN_KEYS + _bins(np.asarray(flat, np.int64))):
            source_kind, b = divmod(key, _BIN_KEYS)
            rows.append((source_kind // kinds, HISTOGRAMS[source_kind % kinds], b, n))
    return rows


def _counted(keys: np.ndarray) -> list[tuple[int, int]]:
    """(key, how many times) of non-negative int keys, by a count per key when they are
    dense enough (no sort), else np.unique."""
    if keys.max() < 1 << 22:
        counts = np.bincount(keys)
        present = np.flatnonzero(counts)
        return list(zip(present.tolist(), counts[present].tolist(), strict=True))
    values, counts = np.unique(keys, return_counts=True)
    return list(zip(values.tolist(), counts.tolist(), strict=True))


def _span_durations(spans: list[tuple[int, list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """The number of blocks of each of ``SourceCache.spans`` and their durations (ns):
    each removal time less its blocks' births."""
    lengths = np.fromiter(map(len, (b for _, b in spans)), np.int64, len(spans))
    births = np.fromiter(
        itertools.chain.from_iterable(b for _, b in spans), np.int64, int(lengths.sum())
    )
    removed = np.repeat(np.fromiter((t for t, _ in spans), np.int64, len(spans)), lengths)
    return lengths, removed - births


def _bins(durations_ns: np.ndarray) -> np.ndarray:
    """Each duration's bin, as ``bin_of`` gives it."""
    ms = durations_ns.astype(np.float64) / 1e6
    with np.errstate(divide="ignore"):
        bins = np.where(ms < 1.0, 0, 1 + np.floor(BINS_PER_OCTAVE * np.log2(np.maximum(ms, 1.0))))
    return bins.astype(np.int64)
