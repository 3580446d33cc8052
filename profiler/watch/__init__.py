"""Watching real vLLM and SGLang deployments: their KV-cache event streams
(ZMQ) and Prometheus /metrics, decoded and recorded into a kvscope database."""
