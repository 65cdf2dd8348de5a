"""What vLLM's model registry says about architectures, recorded per vLLM version."""
