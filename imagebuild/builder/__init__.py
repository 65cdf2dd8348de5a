"""Building images: BuildKit builds, the debootstrapped base, compile parallelism, patch
series, the vLLM source, package indexes, runner hygiene."""
