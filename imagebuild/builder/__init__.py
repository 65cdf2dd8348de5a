"""Building images: BuildKit builds, the bootstrapped base, compile parallelism, patch
series, the vLLM source, package indexes, runner hygiene."""
