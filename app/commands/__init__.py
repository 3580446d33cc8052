"""One module per ``kvscope`` subcommand; each exposes ``register(subparsers)``."""
