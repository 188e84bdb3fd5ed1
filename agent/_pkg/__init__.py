"""pathprof: an eBPF network-path profiler for PostgreSQL."""
__version__ = "0.1.0"
