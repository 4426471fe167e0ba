"""The shape the code is kept in: short functions in the core package; and in the
benchmarks, short functions and files, and suites that import no other suite."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORE = ROOT / "bucketlearn"
BENCHMARKS = ROOT / "benchmarks"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:function") for every function and method under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((lines, f"{path.relative_to(root.parent)}:{node.name}"))
    return found


def test_no_function_in_the_core_is_longer_than_60_lines() -> None:
    """Every function in ``bucketlearn/`` fits on a screen (docstring included)."""
    # Execute
    lengths = function_lengths(CORE)
    # Assert
    assert len(lengths) > 100  # the walk found the package's functions
    too_long = sorted(((n, name) for n, name in lengths if n > MAX_FUNCTION_LINES), reverse=True)
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_no_function_in_the_benchmarks_is_longer_than_60_lines() -> None:
    """Every function in ``benchmarks/`` fits on a screen too (docstring included)."""
    # Execute
    lengths = function_lengths(BENCHMARKS)
    # Assert
    assert len(lengths) > 100  # the walk found the benchmarks' functions
    too_long = sorted(((n, name) for n, name in lengths if n > MAX_FUNCTION_LINES), reverse=True)
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


@pytest.mark.parametrize("root", [CORE, BENCHMARKS], ids=["bucketlearn", "benchmarks"])
def test_no_file_is_longer_than_500_lines(root: Path) -> None:
    """A file a person can read whole: the core package and the benchmarks."""
    # Execute
    lengths = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
               for path in sorted(root.rglob("*.py"))}
    # Assert
    assert len(lengths) > 20  # the walk found the files
    too_long = {name: n for name, n in lengths.items() if n > MAX_FILE_LINES}
    assert not too_long, f"files over {MAX_FILE_LINES} lines: {too_long}"


def test_no_benchmark_suite_imports_another_suite_or_the_runner() -> None:
    """What two suites share lives in ``benchmarks.harness`` or ``benchmarks.report``
    (benchmarks/README.md); the report finds the suites through their registry."""
    # Prepare
    suites = BENCHMARKS / "suites"
    # Execute
    offenders = []
    for path in sorted(suites.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
                names = [f"benchmarks.{alias.name}" for alias in node.names]
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: a sibling suite
                names = [f"benchmarks.suites.{'.' * node.level}{node.module or ''}"]
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name.startswith(("benchmarks.suites", "benchmarks.run"))]
    # Assert
    assert len(list(suites.glob("*.py"))) > 10
    assert not offenders, offenders


def test_the_layering_contracts_hold() -> None:
    """``lint-imports`` (pyproject's [tool.importlinter]): the layers, each importing only
    those below (entry points, the local stack, the aggregation / loops / views, use cases,
    services, ml / ingest, the domain; imports inside functions count, so no circle hides);
    the domain imports no adapter, TensorFlow or Google library; adapters import no service;
    the core is handed its ``ports.Services`` and reaches Google only through the adapters; the
    upload, the aggregation, the learner and the watchdog import none of one another (what they
    share lives in ``usecases.publish``, ``services`` and the domain)."""
    # Execute
    result = subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    # Assert
    assert "Contracts: 6 kept, 0 broken" in result.stdout, result.stdout[-3000:]
    assert result.returncode == 0


@pytest.mark.parametrize("name", ["endings", "task_messages"])
def test_the_job_service_modules_re_export_nothing(name: str) -> None:
    """``services.endings`` and ``services.task_messages`` offer only what they define: every
    name taken from one, ``from bucketlearn.services.<name> import x`` or ``<name>.x`` after
    ``from bucketlearn.services import <name>``, is one of its own; a job's vocabulary comes
    from ``bucketlearn.domain.job`` and ``domain.lifecycle``, the status object from
    ``usecases.status``, ``wait_terminal`` from ``usecases.waiting``."""
    # Prepare
    module = ast.parse((CORE / "services" / f"{name}.py").read_text(encoding="utf-8"))
    own = {node.name for node in module.body
           if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    own |= {target.id for node in module.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}
    declared = next(node.value for node in module.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    # Execute
    taken = []
    for root in ("bucketlearn", "benchmarks", "dashboard", "functions", "workers", "tests"):
        for path in sorted((ROOT / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            aliases = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == f"bucketlearn.services.{name}":
                    taken += [(path, alias.name) for alias in node.names]
                if isinstance(node, ast.ImportFrom) and node.module == "bucketlearn.services":
                    aliases |= {alias.asname or alias.name for alias in node.names
                                if alias.name == name}
            taken += [(path, node.attr) for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id in aliases]
    # Assert
    assert len(taken) > 5  # the walk found the modules that use it
    assert sorted(ast.literal_eval(declared)) == sorted(own - {"__all__"})
    offenders = sorted(f"{path.relative_to(ROOT)}: {n}" for path, n in taken if n not in own)
    assert not offenders, f"names taken from services.{name} that it does not define: {offenders}"


def test_no_test_module_imports_another_test_module() -> None:
    """Shared test code lives in helper modules (``tests/unit/helpers.py``, ``steps.py``, the
    conftests), never in a ``test_*.py`` another module imports."""
    # Prepare
    tests = ROOT / "tests"
    # Execute
    offenders = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and any(
                    part.startswith("test_") for part in node.module.split(".")):
                offenders.append(f"{path.relative_to(ROOT)}: from {node.module}")
    # Assert
    assert len(list(tests.rglob("test_*.py"))) > 30
    assert not offenders, offenders


def test_no_test_monkeypatches_a_tuning_constant_of_the_core() -> None:
    """Knobs a test needs to turn (a learner's pacing, a count's bound) are injected
    (``LearnerTuning``, a ``bound`` argument), not module globals a test rewrites."""
    # Prepare
    tests = ROOT / "tests"
    # Execute
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "setattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str) and node.args[1].value.isupper()):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[1].value}")
    # Assert
    assert not offenders, f"tests that rewrite a module constant: {offenders}"
