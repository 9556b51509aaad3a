"""The model catalog, vLLM engines, the Dramatiq actors that run jobs, and realtime."""
