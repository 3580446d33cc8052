"""Subscribers to the engine's events: the recorder (to SQLite), live derived
metrics, the GPU sampler and the Prometheus exposition."""
