"""GB10 rehearsal on an x86-64 machine with nvcc 13: the gb10 recipe's steps, real source."""
