"""Smoke tests: prove a built serve image serves correctly before anything ships.

Entry points: `runner.smoke_ref` (one image by reference) and `runner.smoke_jobs` (a
release's jobs); what a healthy container must show is expectations.py's (the Job's).
"""
