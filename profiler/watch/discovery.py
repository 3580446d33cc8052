"""SGLang's ``/server_info`` discovery: the event endpoints a server advertises.

SGLang lists ``kv_events`` = {endpoint_host, endpoint_port_base, topic,
block_size, dp_size, replay_endpoint_port_base}; a wildcard host means "this
server's host", taken from the URL that was asked.
"""

from __future__ import annotations

import json
import urllib.error
from typing import Any
from urllib.parse import urlsplit

from kvscope.engine.errors import KvscopeError
from kvscope.profiler.watch.scraper import fetch_text
from kvscope.profiler.watch.sources import SourceSpec, expand_sources

_WILDCARDS = ("", "*", "0.0.0.0", "::", "[::]")


def sources_from_info(url: str, info: Any) -> list[SourceSpec]:
    """The event sources a decoded ``/server_info`` document advertises."""
    events = info.get("kv_events") if isinstance(info, dict) else None
    if not isinstance(events, dict) or events.get("endpoint_port_base") is None:
        raise KvscopeError(f"{url} advertises no kv_events (start SGLang with --kv-events-config)")
    host = events.get("endpoint_host")
    if host is None or str(host) in _WILDCARDS:
        host = urlsplit(url).hostname or "127.0.0.1"
    if ":" in str(host) and not str(host).startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    port = _whole(url, events, "endpoint_port_base")
    replay_port = events.get("replay_endpoint_port_base")
    return expand_sources(
        f"tcp://{host}:{port}",
        replay=None
        if replay_port is None
        else f"tcp://{host}:{_whole(url, events, 'replay_endpoint_port_base')}",
        topic=str(events.get("topic") or ""),
        dp_size=_whole(url, events, "dp_size") if events.get("dp_size") else 1,
        engine="sglang",
    )


def _whole(url: str, events: dict, name: str) -> int:
    """``kv_events[name]`` as an int (a number, or its text); anything else is the
    server's error, said in one line (a list or 'abc' there had been a traceback)."""
    value = events.get(name)
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        number = float(value) if isinstance(value, (float, str)) else value
        if number != int(number):
            raise ValueError
        return int(number)
    except (ValueError, OverflowError):
        raise KvscopeError(
            f"{url} advertises kv_events {name} = {value!r}, not a whole number"
        ) from None


def discover(url: str) -> list[SourceSpec]:
    """Ask a running SGLang server for its event sources; KvscopeError if it cannot say."""
    try:
        info = json.loads(fetch_text(url))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise KvscopeError(f"cannot read {url}: {exc}") from None
    return sources_from_info(url, info)
