"""kvscope's SQLite store: schema and migrations, the batched writer, the read API.

``db.store.open_db`` opens (and creates or migrates) a database; ``db.writer``
writes one run's rows in batches; ``db.queries`` is the read API every front
end uses. See docs/database.md.
"""
