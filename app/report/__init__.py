"""Exported profiling reports of one recorded run: a self-contained HTML page,
a Chrome/Perfetto trace, and the run's tables as CSV or JSON."""
