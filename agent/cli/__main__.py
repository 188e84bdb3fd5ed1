"""`python -m pathprof.agent.cli`: the same as the `pathprof` command."""
import sys

from pathprof.agent.cli.main import main

sys.exit(main())
