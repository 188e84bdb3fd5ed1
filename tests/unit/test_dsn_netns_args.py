"""`run --dsn --netns` refusals (#21.4): --netns only with --dsn, and a namespace that exists; one line each."""
import subprocess
import sys

PP = [sys.executable, "-m", "pathprof.agent.cli.main"]


def test_netns_needs_dsn_and_an_existing_namespace(tmp_path):
    p = subprocess.run([*PP, "run", "--netns", "pp-none", "-T", "1"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("pathprof: error: --netns goes with --dsn"), p.stderr
    p = subprocess.run([*PP, "run", "--dsn", "host=198.18.21.2 port=5 user=postgres", "--netns", "pp-h21-none",
                        "-T", "1", "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "no such network namespace" in p.stderr and p.stderr.count("\n") == 1, p.stderr
