"""How ingest words a file it rejects: the ``InvalidInputError`` whose ``InputProblem`` names the
file, the row and the column, what was expected and what was found (``rejected``), the values
quoted in it cut short (``abbrev``), the problem of a second pass that does not read what the
first one did (``changed_while_read``), and the words the checks of a column's kind share.
"""

from __future__ import annotations

from typing import Any

from bucketlearn.errors import InputProblem, InvalidInputError

KIND_SAYS = "as the column's kind (from its first rows, or column_kinds) says"


def rejected(file: str, message: str, **kw: Any) -> InvalidInputError:
    return InvalidInputError(InputProblem(file=file, message=message, **kw))


def abbrev(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def changed_while_read(file: str, found: str, row: int | None = None,
                       column: str | None = None) -> InvalidInputError:
    """The problem for a second pass that does not read what the first one did."""
    return rejected(file, "the file changed while it was being read", row=row, column=column,
                    expected="the same rows in both passes over the upload (was it replaced "
                             "while it was being split?)", found=found)
