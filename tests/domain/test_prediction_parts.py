"""How a large batch prediction is cut into parts (``part_ranges``) and what a request of parts
came to (``parts_outcome``)."""

from __future__ import annotations

import pytest

from bucketlearn.domain.prediction import part_ranges, parts_outcome


@pytest.mark.parametrize(("size", "part_bytes", "count"), [
    (100, 0, 1), (100, 100, 1), (101, 100, 2), (1000, 100, 10), (10**6, 10, 32)])
def test_ranges_cover_the_file_once_in_even_parts_at_most_the_cap(size: int, part_bytes: int,
                                                                 count: int) -> None:
    ranges = part_ranges(size, part_bytes, 32)
    assert len(ranges) == count and ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))  # no gap
    widths = [end - start for start, end in ranges]
    assert max(widths) - min(widths) <= 1


def test_the_outcome_waits_for_every_part_and_counts_their_rows() -> None:
    done = {"0": {"rows": 5}, "2": {"rows": 7}}
    assert parts_outcome(done, 3) is None
    outcome = parts_outcome({**done, "1": {"rows": 6}}, 3)
    assert (outcome.rows, outcome.error, outcome.problem) == (18, None, None)


def test_a_bad_row_is_counted_from_the_files_first_row_and_the_first_failure_wins() -> None:
    problem = {"file": "gs://b/predict/j/f.csv", "message": "a feature value is not a number",
               "row": 3, "column": "x", "expected": "a number", "found": "abc"}
    results = {"0": {"rows": 5}, "1": {"rows": 2, "error": "row 3", "problem": problem},
               "2": {"rows": 0, "error": "part 3 of 3 was not predicted"}}
    # Execute
    outcome = parts_outcome(results, 3)
    # Assert
    assert outcome.problem["row"] == 8 and outcome.rows == 5
    assert outcome.error == ("gs://b/predict/j/f.csv, row 8, column 'x': a feature value is not "
                             "a number; expected a number; found: abc")
    other = parts_outcome({**results, "1": {"rows": 6}}, 3)
    assert other.error == "part 3 of 3 was not predicted" and other.problem is None
