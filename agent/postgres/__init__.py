"""PostgreSQL and its workload: the owned server (server), its cached initdb template (template),
pgbench (driving it, reading its logs) and the TPC-C scripts. May import agent.host only."""
