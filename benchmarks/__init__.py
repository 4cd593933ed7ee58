"""Benchmarks measured against a lock-based registry and the thread-hop floor."""
