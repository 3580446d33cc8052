"""What to watch: one event source per engine endpoint and data-parallel rank.

vLLM and SGLang give data-parallel rank r the TCP port ``base + r`` (rank 0
keeps the base) or, for ``ipc://``/``inproc://``, the suffix ``_dp{r}``; the
replay endpoint follows the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.errors import KvscopeError

ENGINES = ("vllm", "sglang")
_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One event stream. ``listen`` means kvscope binds ``endpoint`` and engines
    connect to it (vLLM's fan-in): engines pushing to one port are told apart by
    topic and by the DP rank in their payloads."""

    endpoint: str
    replay: str | None = None
    topic: str = ""
    dp_rank: int | None = None
    engine: str = "vllm"
    listen: bool = False


# A TCP port per rank caps a deployment at 65,536 ranks; for ipc:// the same cap keeps
# a typo'd --dp-size (10^8) from building specs for minutes and gigabytes first.
MAX_DP_SIZE = 65536


def check_endpoint(endpoint: str, flag: str = "endpoint") -> None:
    """Raise KvscopeError unless ``endpoint`` is a ZMQ address kvscope can use. What ZMQ
    itself refuses (an empty ipc path, a space in a host) had created a failed run first,
    and what it takes but can never reach (port 0) a complete run of nothing."""
    if not endpoint.startswith(_SCHEMES):
        raise KvscopeError(f"{flag} {endpoint!r} must start with tcp://, ipc:// or inproc://")
    scheme, _, rest = endpoint.partition("://")
    if not rest:
        raise KvscopeError(f"{flag} {endpoint!r} needs a {_WHAT[scheme]}")
    if any(c.isspace() or not c.isprintable() for c in rest):
        raise KvscopeError(f"{flag} {endpoint!r} has a space or a control character in it")
    if scheme == "tcp":
        host, sep, port = rest.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()) or not host:
            raise KvscopeError(f"{flag} {endpoint!r} needs a host and a port")
        if not 1 <= int(port) <= 65535:
            raise KvscopeError(f"{flag} {endpoint!r}: port out of range (1-65535)")


_WHAT = {"tcp": "host and a port", "ipc": "path", "inproc": "name"}


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint data-parallel rank ``rank`` uses, by vLLM's and SGLang's rule."""
    if rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    if int(port) + rank > 65535:
        raise KvscopeError(f"endpoint {endpoint!r}: port {int(port) + rank} of rank {rank} > 65535")
    return f"{base}:{int(port) + rank}"


def expand_sources(
    endpoint: str,
    *,
    replay: str | None = None,
    topic: str = "",
    dp_size: int = 1,
    engine: str = "vllm",
    listen: bool = False,
    flag: str = "endpoint",
) -> list[SourceSpec]:
    """One spec per data-parallel rank: engines offset their endpoint by rank
    whether they bind or connect, so a listening kvscope binds one port per rank too.
    ``flag`` names the option the endpoint came from in an error."""
    if engine not in ENGINES:
        raise KvscopeError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if dp_size < 1:
        raise KvscopeError(f"--dp-size must be at least 1, not {dp_size}")
    if dp_size > MAX_DP_SIZE:
        raise KvscopeError(f"--dp-size {dp_size} is more ranks than kvscope takes ({MAX_DP_SIZE})")
    check_endpoint(endpoint, flag)
    if replay is not None:
        check_endpoint(replay, "--replay" if flag.startswith("--") else "replay endpoint")
    return [
        SourceSpec(
            offset_endpoint(endpoint, rank),
            None if replay is None else offset_endpoint(replay, rank),
            topic,
            rank if dp_size > 1 else None,
            engine,
            listen,
        )
        for rank in range(dp_size)
    ]
