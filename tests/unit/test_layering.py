"""The house's rules that a reader relies on, checked on the source (issue #23): options are parsed once, at the
CLI edge, so nothing below agent/cli sees argparse; analysis never reaches into the agent's run machinery;
topologies share only the agent's host plumbing (agent.host), which reaches no higher layer."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules(*dirs: str):
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _below_cli():
    return [p for p in _modules("agent", "analysis", "topologies") if "cli" not in p.relative_to(ROOT).parts[:2]]


def test_the_tree_is_found():
    # guards the checks below against passing on an empty walk
    assert len(_below_cli()) > 50


@pytest.mark.parametrize("path", _below_cli(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_below_the_cli_sees_argparse(path):
    assert not {n for n in _imports(path) if n.split(".")[0] == "argparse"}, f"{path} imports argparse"


@pytest.mark.parametrize("path", list(_modules("analysis")), ids=lambda p: str(p.relative_to(ROOT)))
def test_analysis_does_not_import_the_cli_or_the_run_machinery(path):
    bad = {n for n in _imports(path) if n.startswith(("pathprof.agent.cli", "pathprof.agent.run"))}
    assert not bad, f"{path} imports {sorted(bad)}"


@pytest.mark.parametrize("path", list(_modules("topologies")), ids=lambda p: str(p.relative_to(ROOT)))
def test_topologies_use_only_the_host_plumbing_of_the_agent(path):
    # one-way flow: the agent builds topologies; topologies share only agent.host (proc, netns, journal, ...)
    bad = {n for n in _imports(path) if n.startswith("pathprof.agent") and not n.startswith("pathprof.agent.host")}
    assert not bad, f"{path} imports {sorted(bad)}"


@pytest.mark.parametrize("path", list(_modules("agent/host")), ids=lambda p: str(p.relative_to(ROOT)))
def test_host_plumbing_reaches_no_higher_layer(path):
    bad = {n for n in _imports(path)
           if n.startswith(("pathprof.agent.cli", "pathprof.agent.run", "pathprof.topologies"))}
    assert not bad, f"{path} imports {sorted(bad)}"
