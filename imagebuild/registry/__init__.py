"""OCI registries: credentials, authentication, the distribution API client, the
release record as a manifest's annotations (records.py), what is kept with a release
(referrers.py) and pushing an image there (push.py)."""
