"""A path pathprof did not build: the machine's sockets in every namespace (sockets), the
client → hops → server chain they form (chain), and the probe configuration and topology document for such
a path (profiled_path). May import agent.host and agent.probing."""
