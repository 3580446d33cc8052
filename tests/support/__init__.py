"""Helpers the test files share: fixtures' builders, probes, payloads, subprocess scripts.

Imported as ``support.<module>``: pytest puts tests/ on ``sys.path`` (``pythonpath``
in pyproject.toml), and collects test files in its ``importlib`` mode, so nothing
else of the repository is importable from a test; the code under test is the
installed ``kvscope`` package.
"""
