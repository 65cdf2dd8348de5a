"""Preflight checks: predict at plan time what would fail minutes into a vLLM boot."""
