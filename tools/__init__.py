"""Development tools: run from a checkout (`python -m tools.NAME` at its root), never
shipped in the wheel (pyproject.toml packages only imagebuild*)."""
