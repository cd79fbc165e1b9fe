"""ContextOS side by side with its peers: `python -m bench` (see docs/benchmarks.md)."""
