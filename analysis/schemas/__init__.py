"""JSON Schemas of the run directory's run.json (`pathprof-run/1.x`) and of the run/report document
(`--json`): what scripts and other tools may rely on. Shipped with the package; tests validate every recorded
fixture and real runs against them."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path


@cache
def load(name: str) -> dict:
    """The schema `name` ("run" or "summary") as a dict."""
    return json.loads((Path(__file__).parent / f"{name}.schema.json").read_text())
