"""Errors the user can act on.

Anything raised as a ``KvscopeError`` reaches the CLI as one line on stderr and
a non-zero exit; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class KvscopeError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelLoadError(KvscopeError):
    """The model file is missing, truncated, or of an unsupported architecture."""


class RequestError(KvscopeError):
    """A request the engine cannot serve (too long, bad sampling values)."""
