"""Building images: BuildKit driving, bootstrap, build parallelism, patches, sources, runner hygiene."""
