"""The user-facing layer: the ``kvscope`` CLI, the Textual TUI, the Dash dashboard, reports and workloads."""
