"""One measurement, start to end: a run on a path pathprof builds (owned), on a server named by a DSN
(dsn) or on live traffic (attach); their options, signals, status file and what is written into the run
directory (recorder). May import agent.postgres, agent.probing, agent.discovery, agent.host, analysis
(rundir, windows, summary) and topologies; never agent.cli."""
