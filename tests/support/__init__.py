"""Code the tests share: the fake Hub, the registry harness, the cpu build, matrix helpers,
vLLM oracle scripts. Data lives in tests/data, never here."""
