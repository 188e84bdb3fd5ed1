"""The command line: argparse, the terminal (console, live view), and the commands over several runs
(compare, sweep, diff, export) and topologies. The only place that sees argparse: everything below gets typed
options. May import agent.run, agent.probing (doctor), agent.host (cleanup), analysis and topologies."""
