"""The release gates a cell passes between smoke and publish: losslessness (speculative
decoding against the same image without it, token by token, fresh and under the
conditions that break it) and long generation (errors, equality, collapse).
docs/release-gates.md says what each proves."""

# one word per gate result; the release record and the table read these
PASS, FAIL, UNTRUSTED, NOT_APPLICABLE = "pass", "fail", "untrusted", "not-applicable"
PASSING = (PASS, NOT_APPLICABLE)
# a condition of the lossless gate (gates/conditions.py) whose load the server's shape or
# the settings do not allow; said with its reason, never a pass by itself
NOT_RUN = "not-run"
