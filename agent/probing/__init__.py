"""The probes' user-space side: loading the BPF objects (bpf/), following the run's processes,
measurement windows, reading the in-kernel aggregates into frames, the probes' own cost, the netfilter hooks
in use, the live breakdown and the capability checks (doctor). May import agent.host and analysis
(histogram, stages); never agent.run or agent.cli."""
