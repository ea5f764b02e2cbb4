"""Benchmarks for the gateway: `python bench/overhead.py` (gateway vs direct); see README.md."""
