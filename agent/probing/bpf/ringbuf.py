"""A BPF_MAP_TYPE_RINGBUF of fixed-size records, read in bulk from its memory map.

libbpf's ring_buffer__consume calls back once per record; through ctypes each call costs a few µs of Python with
the GIL held. At --trace-sample 10 the probes emit ~100k records a second, and the consumer thread took most of a
CPU of this 2-core machine from the workload and starved the agent's other threads (the pooler-counters sampler
took 1 sample in 3 s in CI). Here one drain copies everything committed as one bytes object and checks the record
headers with numpy: one pass over memory, no call per record.

The layout is the kernel's (kernel/bpf/ringbuf.c), as libbpf maps it: page 0 the consumer position (ours to
write), page 1 the producer position, then the data area mapped twice in a row, so a record that wraps reads as
one slice. Each record: an 8-byte header (length, BUSY bit while the producer writes it, DISCARD bit), then the
record, padded to 8 bytes. A record still BUSY ends the drain: records after it wait for the next one."""
from __future__ import annotations

import mmap
import struct

import numpy as np

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HEADER = 8


class FixedRecordRing:
    """Drains a ring buffer map whose records are all `record_size` bytes (one C struct)."""

    def __init__(self, map_fd: int, max_entries: int, record_size: int, sink=None):
        if max_entries & (max_entries - 1) or max_entries < mmap.PAGESIZE:
            raise ValueError(f"a ring buffer's size is a power of two of at least a page, not {max_entries}")
        self.size = max_entries
        self.record_size = record_size
        self.stride = (record_size + HEADER + 7) & ~7
        page = mmap.PAGESIZE
        self._consumer = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._producer = mmap.mmap(map_fd, page + 2 * max_entries, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self.records = 0
        self._sink = sink        # consume() hands it each drain's records

    def drain(self) -> bytes:
        """Every record committed since the last drain, back to back (n x record_size bytes)."""
        cons = struct.unpack_from("<Q", self._consumer, 0)[0]
        prod = struct.unpack_from("<Q", self._producer, 0)[0]   # x86: later loads are not moved before this one
        if prod <= cons:
            return b""
        start = mmap.PAGESIZE + (cons & (self.size - 1))
        raw = self._producer[start:start + (prod - cons)]       # the second mapping makes a wrap one slice
        out, used = self._records(raw)
        if used:
            struct.pack_into("<Q", self._consumer, 0, cons + used)  # the kernel may reuse what we passed
        return out

    def _records(self, raw: bytes) -> tuple[bytes, int]:
        """(the committed records' bytes, how many bytes of the ring they took) from `raw`, a copy of the ring
        between the two positions."""
        n = len(raw) // self.stride
        heads = np.frombuffer(raw, dtype="<u4", count=n * self.stride // 4).reshape(n, self.stride // 4)[:, 0] \
            if n else np.empty(0, dtype="<u4")
        lens = heads & ~np.uint32(BUSY_BIT | DISCARD_BIT)
        busy = np.flatnonzero((heads & BUSY_BIT) != 0)
        if len(busy):
            n = int(busy[0])
        if n and not (lens[:n] == self.record_size).all():   # a record of another size: the general walk
            return self._walk(raw)
        body = np.frombuffer(raw, dtype=np.uint8, count=n * self.stride).reshape(n, self.stride)
        keep = (heads[:n] & DISCARD_BIT) == 0
        out = body[keep, HEADER:HEADER + self.record_size].tobytes()
        self.records += int(keep.sum())
        return out, n * self.stride

    def _walk(self, raw: bytes) -> tuple[bytes, int]:
        """Record by record: only if a record of another size was ever reserved (not by today's probes)."""
        out, off = [], 0
        while off + HEADER <= len(raw):
            head = struct.unpack_from("<I", raw, off)[0]
            if head & BUSY_BIT:
                break
            length = head & ~(BUSY_BIT | DISCARD_BIT)
            step = (length + HEADER + 7) & ~7
            if off + step > len(raw):
                break
            if not head & DISCARD_BIT and length == self.record_size:
                out.append(raw[off + HEADER:off + HEADER + length])
                self.records += 1
            off += step
        return b"".join(out), off

    def close(self) -> None:
        for m in (self._consumer, self._producer):
            if not m.closed:
                m.close()

    # the interface of libbpf.RingBuffer, which the session holds either of
    def consume(self) -> int:
        data = self.drain()
        if data:
            self._sink(data)
        return len(data) // self.record_size

    def free(self) -> None:
        self.close()


def ring_reader(bpf_map, record_size: int, sink):
    """consume()/free() over a loaded ring buffer map, `sink(bytes)` getting its records (back to back). The bulk
    reader where loads keep their order without barriers (x86-64: a header read as committed has its record
    written); libbpf's reader, one callback a record, elsewhere."""
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        return FixedRecordRing(bpf_map.fd, bpf_map.max_entries, record_size, sink)
    from pathprof.agent.probing.bpf.libbpf import RingBuffer
    return RingBuffer(bpf_map.fd, sink)
