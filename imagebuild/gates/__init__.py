"""The release gates a cell passes between smoke and publish: losslessness (speculative
decoding against the same image without it, token by token) and long generation (errors,
equality, collapse). docs/release-gates.md says what each proves."""

# one word per gate result; the release record and the table read these
PASS, FAIL, UNTRUSTED, NOT_APPLICABLE = "pass", "fail", "untrusted", "not-applicable"
PASSING = (PASS, NOT_APPLICABLE)
