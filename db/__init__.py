"""kvscope's SQLite store: schema and migrations, the batched writer, the read layer.

``db.store.open_db`` opens (and creates or migrates) a database; ``db.writer``
writes one run's rows in batches; the read layer (``db.runs``, ``db.series``,
``db.pages``, ``db.events``, ``db.requests``, ``db.kernels``, ``db.raw``,
gathered by ``db.queries``) holds every query and derived figure the front
ends show. See docs/database.md.
"""
