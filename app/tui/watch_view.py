"""The terminal view of a watched vLLM/SGLang deployment (run kind ``watch``).

Pure renderers over ``db.watch_read`` results (tested without a terminal)
and one widget, ``WatchView``, that re-queries the database on a timer in a
worker thread (one at a time, and only when something was written or the
window changed: ``w`` cycles ``watch_read.WINDOWS``) and repaints. The
queries read the recorder's aggregates, so a refresh costs the same an hour
into a busy fleet as in its first minute. Registering it in the TUI is
mounting ``WatchView(db_path, run_id)`` when the selected run's kind is
``watch``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.widgets import Static

from kvscope.db import watch_read as q
from kvscope.db.watch_snapshot import WatchSnapshot, watch_snapshot

REFRESH_S = 1.0


def sources_table(sources: Sequence[q.WatchSource]) -> Table:
    """One row per stream: what it delivered and what it lost."""
    table = Table(title="sources", expand=True, title_justify="left")
    for name in (
        "source",
        "engine",
        "batches",
        "block events",
        "gaps",
        "replayed",
        "lost",
        "restarts",
    ):
        table.add_column(name, justify="left" if name in ("source", "engine") else "right")
    for s in sources:
        lost_style = "bold red" if s.lost_batches else ""
        table.add_row(
            s.label,
            s.engine if s.kind == "events" else f"{s.engine} /metrics",
            f"{s.batches:,}",
            f"{s.block_events:,}",
            str(s.gaps),
            str(s.recovered_batches),
            Text(str(s.lost_batches), style=lost_style),
            str(s.restarts),
        )
    return table


def fields_text(sources: Sequence[q.WatchSource]) -> Text:
    """The newer per-event fields each source sent (groups, LoRAs, sessions, salts)."""
    text = Text()
    for s in sources:
        summary = q.attrs_summary(s.attrs)
        if summary:
            text.append(f"{s.label}: {summary}\n", style="#8c9bb0")
    return text


def blocks_table(stats: Sequence[q.BlockStats], windowed: bool = False) -> Table:
    """Per source: cached blocks by medium, reuse, churn, clears and lifetimes
    (``windowed``: stores, removals and recomputations are the window's)."""
    title = (
        "blocks: stored, removed, recomputed (and prefill) in the window; cached now; "
        "reused, cleared, life over the whole session"
        if windowed
        else "blocks"
    )
    table = Table(title=title, expand=True, title_justify="left")
    for name in (
        "source",
        "cached",
        "stored",
        "removed",
        "reused",
        "recomputed",
        "cleared",
        "p50 life s",
    ):
        table.add_column(name, justify="left" if name in ("source", "cached") else "right")
    for s in stats:
        cached = " ".join(f"{m}:{n}" for m, n in sorted(s.cached.items(), key=str)) or "0"
        life = "—" if s.lifetime_p50_s is None else f"{s.lifetime_p50_s:.2f}"
        table.add_row(
            str(s.source),
            cached,
            f"{s.stored:,}",
            f"{s.removed:,}",
            f"{s.reannounced:,}",
            f"{s.recomputed:,}",
            str(s.clears + s.resets),
            life,
        )
    return table


def fleet_text(dups: Sequence[q.Duplication], prefixes: Sequence[q.SharedPrefix]) -> Text:
    """Duplicated blocks across replicas and the largest shared prefixes, as lines."""
    text = Text()
    for d in dups:
        tokens = "" if d.extra_tokens is None else f" ({d.extra_tokens:,} tokens)"
        text.append(
            f"{d.engine}: {d.duplicated_blocks:,} blocks on >= 2 replicas, "
            f"{d.extra_copies:,} extra copies{tokens}, peak {d.peak_extra_copies:,}\n"
        )
    for p in prefixes[:5]:
        tokens = "" if p.prefix_tokens is None else f" = {p.prefix_tokens:,} tokens"
        text.append(
            f"prefix of {p.depth_blocks} blocks{tokens}: {p.branches} branches, "
            f"{p.subtree_blocks} blocks under it, sources {', '.join(map(str, p.sources))}\n",
            style="#8c9bb0",
        )
    return text


def incidents_text(incidents: Sequence[q.Incident], limit: int = 8) -> Text:
    """The newest incidents, losses in red."""
    text = Text()
    for i in list(reversed(incidents))[:limit]:
        seqs = "" if i.first_seq is None else f" seq {q.seq_range(i.first_seq, i.last_seq)}"
        style = "bold red" if i.lost or i.kind == "restart" else ""
        text.append(f"{i.t_s:9.2f}s  source {i.source}  {i.kind}{seqs}", style=style)
        if i.lost or i.recovered:
            text.append(f"  recovered {i.recovered} lost {i.lost}", style=style)
        if i.detail:
            text.append(f"  {i.detail}", style="#6b7385")
        text.append("\n")
    return text


def window_text(name: str, window: q.Window | None) -> Text:
    """The header: the window shown, the key that changes it, what follows it."""
    text = Text(f"window: {name}", style="bold")
    if window is not None:
        text.append(f" ({q.window_label(window)})")
    text.append("  [w] next window", style="#8c9bb0")
    if window is not None:
        text.append(
            "\nfollow the window: stored, removed, recomputed, routing misses, their "
            "rates and shares of prefill; now: cached, duplication; whole session: "
            "reused, lifetimes, prefixes",
            style="#8c9bb0",
        )
    return text


def _miss_part(blocks: int, rate: float | None, share: float | None) -> str:
    per_s = "" if rate is None else f" {rate:,.1f} tok/s"
    pct = "" if share is None else f" {share:.1%} of prefill"
    return f"{blocks:,}{per_s}{pct}"


def misses_text(misses: Sequence[q.Misses], scope: str = "") -> Text:
    """Recomputation after eviction and routing misses, fleet-wide and per source
    (``scope``: what the figures are over, when not the whole session)."""
    text = Text()
    if scope and any(m.new_blocks is None for m in misses):
        text.append(f"{q.SHARES_UNKNOWN}\n", style="#8c9bb0")
    for m in misses:
        who = f"{m.engine} fleet" if m.source is None else f"source {m.source}"
        who = f"{who} {scope}" if scope else who
        recomputed = _miss_part(m.recomputed, m.per_s(m.recomputed_tokens), m.recomputed_share)
        routing = _miss_part(m.routing_misses, m.per_s(m.routing_miss_tokens), m.routing_share)
        text.append(
            f"{who}: recomputed after eviction {recomputed}; routing misses {routing}\n",
            style="bold" if m.source is None else "#8c9bb0",
        )
    return text


def snapshot(source: q.Source, run_id: int, window_name: str | None = None) -> WatchSnapshot:
    """What the view shows for one of ``watch_read.WINDOWS`` (by name; None: the
    whole session): the views' one snapshot (``db.watch_snapshot``)."""
    name, window = q.named_window(source, run_id, window_name)
    return watch_snapshot(source, run_id, window, name, series=False)  # it draws none


def render(snap: WatchSnapshot) -> RenderableType:
    windowed = snap.window is not None
    return Group(
        window_text(snap.window_name, snap.window),
        sources_table(snap.sources),
        fields_text(snap.sources),
        blocks_table(snap.stats, windowed),
        misses_text(snap.misses, "in the window" if windowed else ""),
        fleet_text(snap.duplication, snap.prefixes),
        incidents_text(snap.incidents),  # the newest 8
    )


class WatchView(Static):
    """A watch run, refreshed every ``REFRESH_S`` from the database.

    One refresh at a time: a tick that finds the previous one still running is
    skipped, and one that finds nothing new (``watch_read.version``, the
    same window) costs one small query and no repaint. ``w`` shows the next of
    ``watch_read.WINDOWS``; the view takes the focus so that its key works.
    """

    can_focus = True
    BINDINGS = [Binding("w", "next_window", "Window")]

    def __init__(self, db_path: str | os.PathLike[str], run_id: int, **kwargs) -> None:
        super().__init__("loading…", **kwargs)
        self.db_path = db_path
        self.run_id = run_id
        self.snapshot: WatchSnapshot | None = None  # the one shown
        self.shown_version: tuple | None = None
        self.refreshes = 0  # snapshots taken (what a finished run stops doing)
        self.window_index = 0  # into watch_read.WINDOWS
        self._busy = threading.Lock()

    def on_mount(self) -> None:
        self.focus(scroll_visible=False)
        self.tick()
        self.set_interval(REFRESH_S, self.tick)

    def action_next_window(self) -> None:
        self.window_index = (self.window_index + 1) % len(q.WINDOWS)
        self.tick()  # or the next timer's, if one is running

    def tick(self) -> None:
        if self._busy.acquire(blocking=False):
            self.reload()

    @work(thread=True)
    def reload(self) -> None:
        try:
            snap = self.refresh_snapshot()
        finally:
            self._busy.release()
        if snap is not None:
            self.app.call_from_thread(self._show, snap)

    def refresh_snapshot(self) -> WatchSnapshot | None:
        """A new snapshot when the database changed since the one shown, else None."""
        window_name = q.WINDOWS[self.window_index][0]
        with q.connection(self.db_path) as conn:
            version = (q.version(conn, self.run_id), window_name)
            if version == self.shown_version:
                return None
            snap = snapshot(conn, self.run_id, window_name)
        self.shown_version = version
        self.refreshes += 1
        return snap

    def _show(self, snap: WatchSnapshot) -> None:
        self.snapshot = snap
        self.update(render(snap))
