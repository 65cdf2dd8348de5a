"""Benchmarks of serve images (issue 8): measure, store with the release, compare, gate."""
