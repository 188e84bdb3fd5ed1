"""The bulk ring-buffer reader's record walk, on a ring image built here (the kernel's layout: 8-byte header with
BUSY and DISCARD bits, records padded to 8). The real ring under real probes: tests/integration (--trace-sample
runs read it)."""
import struct

from pathprof.agent.probing.bpf.ringbuf import BUSY_BIT, DISCARD_BIT, FixedRecordRing


def _reader(record_size):
    r = FixedRecordRing.__new__(FixedRecordRing)      # no map: only the walk over a copy of the ring
    r.record_size, r.stride, r.records = record_size, (record_size + 8 + 7) & ~7, 0
    return r


def _record(body: bytes, flags: int = 0, size: int | None = None) -> bytes:
    size = len(body) if size is None else size
    pad = (-(size + 8)) % 8
    return struct.pack("<II", size | flags, 0) + body + b"\0" * pad


def test_committed_records_come_back_to_back_and_discarded_ones_do_not():
    r = _reader(12)
    raw = _record(b"a" * 12) + _record(b"b" * 12, DISCARD_BIT) + _record(b"c" * 12)
    out, used = r._records(raw)
    assert out == b"a" * 12 + b"c" * 12 and used == len(raw) == 3 * 24 and r.records == 2


def test_a_busy_record_ends_the_drain_and_what_follows_waits():
    r = _reader(16)
    raw = _record(b"a" * 16) + _record(b"b" * 16, BUSY_BIT) + _record(b"c" * 16)
    out, used = r._records(raw)
    assert out == b"a" * 16 and used == 24         # the consumer stops before the busy one: it is read next time


def test_a_record_of_another_size_is_walked_one_by_one():
    r = _reader(8)
    raw = _record(b"a" * 8) + _record(b"odd", size=3) + _record(b"b" * 8) + _record(b"x" * 8, BUSY_BIT)
    out, used = r._records(raw)
    assert out == b"a" * 8 + b"b" * 8 and used == 16 + 16 + 16 and r.records == 2


def test_a_partial_copy_ends_at_the_last_whole_record():
    r = _reader(8)
    raw = _record(b"a" * 8) + _record(b"b" * 8)[:10]
    assert r._records(raw) == (b"a" * 8, 16)
    assert r._records(b"") == (b"", 0)
