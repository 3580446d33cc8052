"""Parsing the Prometheus text exposition format (0.0.4), as vLLM and SGLang serve it.

Small on purpose: kvscope needs sample lines only (name, labels, value), and
must not depend on prometheus_client being installed.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\[\\\"n]")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def _value(text: str) -> float:
    text = text.strip()
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    return float(text)  # also "NaN"


def parse_labels(text: str) -> dict[str, str]:
    """``k="v",...`` (as in a sample line, or as ``label_text`` writes it) as a dict."""
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if match is None:
            if text[pos:].strip():
                raise ValueError(f"bad labels {text!r}")
            break
        labels[match[1]] = _ESCAPE.sub(lambda m: _ESCAPES[m[0]], match[2])
        pos = match.end()
    return labels


def parse(text: str) -> list[Sample]:
    """Every sample in ``text``; raises ValueError for a malformed line."""
    samples: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                raise ValueError(f"bad sample line {line!r}")
            name, labels, rest = (
                line[:brace],
                parse_labels(line[brace + 1 : close]),
                line[close + 1 :],
            )
        else:
            name, _, rest = line.partition(" ")
            labels = {}
        parts = rest.split()
        if not name or not parts:
            raise ValueError(f"bad sample line {line!r}")
        samples.append(Sample(name, labels, _value(parts[0])))  # a timestamp may follow
    return samples


def label_text(labels: dict[str, str]) -> str:
    """Labels in one canonical spelling (sorted, escaped, without braces) for storage;
    ``parse_labels`` reads it back."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
