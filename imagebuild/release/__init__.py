"""Releases in the registry: publish, the lease, moving latest, prune, release notes."""
