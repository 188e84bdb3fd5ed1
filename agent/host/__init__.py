"""Plumbing on the host, shared by agent/ and topologies/: processes (proc), network namespaces
(netns), the journal of every object created and its undo (journal, cleanup), iptables batches, loop
devices and mounts (storage), the blkio throttle (io_limit), the delay line of impaired links (delayline) and
what the machine is (machine). Imports nothing of pathprof but pathprof.errors (and, lazily, its own
modules); topologies/ and every other agent package may import it."""
