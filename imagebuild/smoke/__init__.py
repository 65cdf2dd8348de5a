"""Smoke tests: prove a built serve image serves correctly before anything ships.

Entry points: `runner.smoke_ref` (one image by reference) and `runner.smoke_jobs` (a
release's jobs); `expect` says what a healthy container of an image must show.
"""
