"""Markdown: the goals table, then one section per benchmark with its date, its machine and its
tables (the suite's own ``tables``, or ``TABLE_HEADER`` and ``table_rows``, and any
``extra_tables``)."""

from __future__ import annotations

from typing import Any

from benchmarks.suites import NAMES, SUITES, load


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(machine: dict[str, Any]) -> str:
    packages = machine.get("packages", {})
    tf = packages.get("tensorflow-cpu") or packages.get("tensorflow") or "?"
    return (f"{machine.get('nproc')} cores ({machine.get('cpu_model')}), "
            f"{machine.get('ram_gib')} GiB RAM, Python {machine.get('python')}, TensorFlow {tf}, "
            f"pyarrow {packages.get('pyarrow', '?')}, pandas {packages.get('pandas', '?')}; "
            f"load average {_loads(machine.get('load_average_at_start'))} at start, "
            f"{_loads(machine.get('load_average_at_end'))} at end")


def _loads(values: list[float] | None) -> str:
    return "/".join(f"{x:.1f}" for x in values) if values else "?"


def render(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: the goals table, then one table per benchmark, each with its date and machine."""
    present = [(name, results[name]) for name in NAMES if results.get(name)]
    parts = []
    goals = goals_table(present)
    if goals:
        parts.append(goals)
    for name, result in present:
        parts.extend(section(name, result))
    return "\n\n".join(parts) + "\n"


def goals_table(present: list[tuple[str, dict[str, Any]]]) -> str | None:
    """Every benchmark's goals in one table (None: no goals)."""
    rows = []
    for name, result in present:
        for g in result.get("goals", []):
            rows.append([SUITES[name], g["name"], _fmt(g["value"]), g["target"],
                         _fmt(g["met"]), result["date"][:10] + (" (smoke)" if result.get("smoke") else "")])
    if not rows:
        return None
    return "#### Goals\n\n" + md_table(["benchmark", "figure", "value", "goal", "met",
                                        "measured"], rows)


def section(name: str, result: dict[str, Any]) -> list[str]:
    """A benchmark's section: its heading, when and on what it was measured, its tables."""
    module = load(name)
    seconds = result.get("seconds")
    wall = f"; benchmark wall time {seconds:.0f} s" if seconds is not None else ""
    header = (f"#### {SUITES[name]}\n\n"
              f"Measured {result['date']} on {machine_line(result['machine'])}"
              f"{' — SMOKE sizes' if result.get('smoke') else ''}{wall}."
              + (f" **Reduced run:** {', '.join(result['reduced'])}." if result.get("reduced")
                 else ""))
    if hasattr(module, "tables"):
        body = "\n\n".join(f"{title}:\n\n{md_table(columns, rows)}"
                           for title, columns, rows in module.tables(result))
    else:
        body = md_table(module.TABLE_HEADER, module.table_rows(result))
    extra = getattr(module, "extra_tables", None)
    return [header + "\n\n" + body, *(extra(result) if extra is not None else [])]
