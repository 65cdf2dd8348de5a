"""Releases in the registry: publish, records, the lease, moving latest, prune, release notes."""
