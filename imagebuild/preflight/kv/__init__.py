"""KV-cache layout model of vLLM 0.23: dtypes, per-family layer layouts, block sizes, unify."""
