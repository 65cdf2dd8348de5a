"""registry/streams.py: parallel gzip is one gzip file of members in order, read whole by
a multistream reader (Python's, as Go's); read-ahead hands on errors where the next chunk
is wanted."""

from __future__ import annotations

import gzip
import os
import threading
import zlib

import pytest

from imagebuild.registry.streams import gzip_members, prefetched


def _chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 50_000])
def test_members_in_order_are_the_stream(size):
    data = os.urandom(size // 2) + b"a" * (size - size // 2)
    out = b"".join(gzip_members(_chunks(data, 777), piece=4096, workers=3))
    assert gzip.decompress(out) == data  # multistream, as Go's gzip reader
    members = max(1, -(-size // 4096))
    assert out.count(b"\x1f\x8b\x08\x00") >= members


def test_gzip_is_the_same_bytes_every_time():
    data = os.urandom(30_000)
    runs = {b"".join(gzip_members(_chunks(data, 1000), piece=8192, workers=w))
            for w in (1, 2, 5)}
    assert len(runs) == 1  # a layer compressed twice is the same blob


def test_a_single_member_reader_sees_only_the_first_piece():
    """The control: the pieces are separate members (what makes them parallel)."""
    data = b"x" * 10_000
    out = b"".join(gzip_members(_chunks(data, 1000), piece=4096, workers=2))
    assert zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(out) == data[:4096]


def test_read_ahead_runs_on_its_own_thread_and_hands_on_errors():
    seen = []

    def source():
        seen.append(threading.current_thread().name)
        yield b"one"
        raise OSError("disk gone")

    it = prefetched(source())
    assert next(it) == b"one"
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert seen == ["push-read"]


def test_a_reader_that_stops_early_ends_the_producer():
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield b"x"

    it = prefetched(source(), depth=2)
    next(it)
    it.close()
    threading.Event().wait(0.5)
    assert len(produced) < 10
