"""Every relative link in the README and docs/ points at a file that exists, and every
``#anchor`` at a heading of that file (the README was split into docs/ pages)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors: a heading lower-cased, punctuation but hyphens dropped, spaces as -."""
    found = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_relative_link_of_the_docs_resolves() -> None:
    # Prepare
    pages = [ROOT / "README.md", ROOT / "infra" / "README.md", *(ROOT / "docs").glob("*.md")]
    # Execute
    broken, checked = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(
                    dest.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    # Assert
    assert checked > 30
    assert not broken, broken


def test_the_benchmarks_doc_has_each_section_once_in_order() -> None:
    """docs/BENCHMARKS.md: the generated tables (#### 1.-4., and 7. for the speed-up) and the
    narrative (### the same, 8. for the recipe, 9. for the search in one process and 10. on
    the pool, each run on its own) each appear once, in order; a hand edit of the narrative once
    dropped two of its sections and another left a second copy of the tables."""
    # Prepare
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    # Execute
    generated = re.findall(r"^#### (\d)\. ", text, flags=re.M)
    narrative = re.findall(r"^### (\d+)\. ", text, flags=re.M)
    # Assert
    assert generated == ["1", "2", "3", "4", "7"], generated
    assert narrative == ["1", "2", "3", "4", "7", "8", "9", "10", "11", "12"], narrative
    assert text.index("## What the numbers mean") < text.index("\n### 1. ")
