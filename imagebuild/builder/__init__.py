"""Building images: BuildKit builds, the bootstrapped base, compile parallelism, runner
hygiene."""
