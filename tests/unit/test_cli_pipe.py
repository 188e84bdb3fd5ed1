"""`pathprof report RUN | head`: the reader goes away, the report stops quietly (no traceback, no error line)."""
import os
import sys
from pathlib import Path

from pathprof.agent.cli.main import main

RUN = Path(__file__).parent / "data" / "runs" / "loopback"


def test_report_into_a_closed_pipe_exits_quietly(capsys, monkeypatch):
    r, w = os.pipe()
    os.close(r)                                   # `head` has read what it wanted and left
    out = os.fdopen(w, "w", buffering=1)          # line-buffered: the first line written meets the closed pipe
    monkeypatch.setattr(sys, "stdout", out)
    try:
        code = main(["report", str(RUN)])
    finally:
        out.close()
    err = capsys.readouterr().err
    assert code == 1 and err == "", err
