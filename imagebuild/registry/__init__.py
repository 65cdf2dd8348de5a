"""OCI registries: credentials, authentication, the distribution API client, and the
release record as a manifest's annotations (records.py)."""
