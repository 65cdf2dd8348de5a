"""OCI registries: credentials, authentication and the distribution API client."""
