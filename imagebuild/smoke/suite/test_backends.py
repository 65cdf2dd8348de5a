"""The kernels vLLM chose at boot are the ones the profile expects (`expect_backends:`)."""

from __future__ import annotations

from imagebuild.smoke.backends import KINDS, mismatches, read_log


def test_kernel_backends_are_the_expected_ones(api, expect, log_lines, record_property):
    # read with the messages of the image's own vLLM version (expectations' log_readers)
    chosen = read_log(log_lines, expect["log_readers"])
    for kind in KINDS:  # what vLLM chose goes into the verdict either way
        if chosen.seen.get(kind):
            record_property(kind, ",".join(chosen.seen[kind]))
    want = expect.get("expect_backends") or {}
    metrics = api("GET", "/metrics", timeout=30).text
    bad = mismatches(want, chosen, metrics, expect["log_unreadable"])
    assert not bad, ("vLLM chose other kernels than the profile's expect_backends:\n"
                     + "\n".join(bad))
