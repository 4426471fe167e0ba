"""Merge parity results of several invocations into one (the full matrix is run in parts on a
2-core machine: an order, the stack, the held-out sets at the end).

    python -m benchmarks.tools.merge_parity OUT.json BASE.json OTHER.json [...] [--doc]

Serial training and the simulation are deterministic (one TensorFlow thread): a seed of a cell
present in two files must have the same serial figure and the same simulated runs (checked; a
difference is reported and the merge refused). Stack runs of the same cell and seed, from
different invocations, are all kept (each is a run of the real stack). Cells only one file
has are taken as they are. The merged cells are concluded as one run (``suites.parity.conclude``);
``--doc`` then refreshes docs/BENCHMARKS.md from the results directory of OUT.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.report.doc import refresh_doc
from benchmarks.report.results import load_results, new_result
from benchmarks.suites import NAMES, parity


def merge_cells(cells: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Merge ``other``'s cells into ``cells`` in place; the disagreements found."""
    problems = []
    for key, cell in other.items():
        if key not in cells:
            cells[key] = copy.deepcopy(cell)
            continue
        mine = cells[key]
        mine["held_out"] = mine["held_out"] or cell["held_out"]
        for seed, one in cell["seeds"].items():
            if seed not in mine["seeds"]:
                mine["seeds"][seed] = copy.deepcopy(one)
                continue
            have = mine["seeds"][seed]
            if have["serial"] != one["serial"]:
                problems.append(f"{key} seed {seed}: serial {have['serial']} vs {one['serial']}")
            for name, runs in one["pipeline"].items():
                if name not in have["pipeline"]:
                    have["pipeline"][name] = copy.deepcopy(runs)
                elif name.startswith("stack-"):
                    have["pipeline"][name].extend(copy.deepcopy(runs))
                elif [_figure(r) for r in have["pipeline"][name]] != [_figure(r) for r in runs]:
                    problems.append(f"{key} seed {seed}: {name} differs")
    return problems


def load(path: Path) -> dict[str, Any]:
    """A parity result, or a run's checkpoint (``parity.partial.json`` of a run stopped
    part-way) as a result of what it holds."""
    found = json.loads(path.read_text())
    if "figures" in found:
        return found
    result = new_result("parity", False, found["params"])
    result["code"] = None
    result["figures"] = parity.assemble(found["params"], found["seeds"], found["stack"])
    result["notes"].append(f"{path}: a run stopped part-way (its checkpoint)")
    return result


def _figure(run: dict[str, Any]) -> Any:
    return run.get("rmse") if run.get("accuracy") is None else run["accuracy"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("base", type=Path)
    parser.add_argument("others", type=Path, nargs="+")
    parser.add_argument("--doc", action="store_true", help="refresh docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    merged = load(args.base)
    cells = merged["figures"]
    sources, problems = [merged.get("code")], []
    for path in args.others:
        other = load(path)
        sources.append(other.get("code") or str(path))
        problems += merge_cells(cells, other["figures"])
    if problems:
        print("not merged; the deterministic figures disagree:\n" + "\n".join(problems))
        return 1
    names = list(dict.fromkeys(cell["dataset"] for cell in cells.values()))
    cells = {key: cells[key] for key in sorted(
        cells, key=lambda k: (names.index(cells[k]["dataset"]), cells[k]["order"] != "sorted"))}
    parity.conclude(merged, cells)
    merged["notes"] = [n for n in merged["notes"] if not n.startswith("merged from")]
    merged["notes"].append("merged from invocations: " + json.dumps(sources))
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    for found in merged["goals"]:
        print(found)
    if args.doc:
        refresh_doc(load_results(args.out.parent, NAMES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
