"""The batch prediction benchmark's pure helpers (``benchmarks/suites/batch_predict.py``): the
prediction file it draws, the outputs it reads back, the parts it records. No stack here."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.suites import batch_predict

SOURCE = ('species,island,bill_length_mm,note\n'
          'Adelie,Torgersen,39.1,"quoted, with a comma"\n'
          '\n'
          'Gentoo,Biscoe,NA,\n'
          'Chinstrap,Dream,46.5,"say ""hi"""\n')


def _rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


def test_the_prediction_file_draws_rows_without_the_label_with_their_cells(tmp_path) -> None:
    # Arrange
    source = tmp_path / "source.csv"
    source.write_text(SOURCE, encoding="utf-8")
    out = tmp_path / "rows.csv"
    # Execute: 500 rows drawn from 3 (the blank line is no row)
    size = batch_predict.write_prediction_file(source, "species", 500, 7, out)
    # Assert: the header without the label; every row one of the source's, cells intact
    header, *body = _rows(out)
    assert size == out.stat().st_size
    assert header == ["island", "bill_length_mm", "note"]
    assert len(body) == 500
    allowed = {("Torgersen", "39.1", "quoted, with a comma"), ("Biscoe", "NA", ""),
               ("Dream", "46.5", 'say "hi"')}
    assert {tuple(r) for r in body} == allowed  # all three drawn in 500
    assert "Adelie" not in out.read_text(encoding="utf-8")


def test_the_draw_is_seeded(tmp_path) -> None:
    source = tmp_path / "source.csv"
    source.write_text(SOURCE, encoding="utf-8")
    paths = [tmp_path / f"{n}.csv" for n in ("a", "b", "c")]
    for path, seed in zip(paths, (1, 1, 2), strict=True):
        batch_predict.write_prediction_file(source, "species", 200, seed, path)
    texts = [p.read_bytes() for p in paths]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_a_missing_label_column_is_refused(tmp_path) -> None:
    source = tmp_path / "source.csv"
    source.write_text(SOURCE, encoding="utf-8")
    with pytest.raises(ValueError, match="'label'"):
        batch_predict.write_prediction_file(source, "label", 10, 0, tmp_path / "out.csv")


def test_predictions_are_read_back_from_either_output(tmp_path) -> None:
    # Arrange: a request's output (every cell quoted, a newline inside one) and the command's
    request = tmp_path / "request.csv"
    request.write_text('"island","note","prediction","probability_Adelie"\n'
                       '"Dream","two\nlines","Chinstrap",0.1\n\n"Biscoe","","Gentoo",0.2\n',
                       encoding="utf-8")
    command = tmp_path / "command.csv"
    command.write_text("row,prediction\n1,Chinstrap\n2,Adelie\n", encoding="utf-8")
    # Execute
    found, expected = (batch_predict.read_predictions(p) for p in (request, command))
    # Assert
    assert found == ["Chinstrap", "Gentoo"]
    assert expected == ["Chinstrap", "Adelie"]
    assert batch_predict.agreement(found, expected) == 0.5
    assert batch_predict.agreement(found, expected[:1]) == 0.5  # a missing row is a difference
    assert batch_predict.agreement(found, found) == 1.0


@dataclass(frozen=True)
class _WithParts:
    parts: object


class _Plain:
    def status(self) -> dict:
        return {"state": "DONE"}


class _InStatus:
    def status(self) -> dict:
        return {"state": "DONE", "parts": 4}


@pytest.mark.parametrize(("record", "parts"), [
    (_WithParts(3), 3), (_WithParts(None), 1), (_WithParts(0), 1), (_WithParts(True), 1),
    (_WithParts("3"), 1), (_Plain(), 1), (_InStatus(), 4)])
def test_parts_are_the_records_count_or_one(record, parts) -> None:
    assert batch_predict.parts_of(record) == parts


def test_rates_and_cpu_deltas() -> None:
    assert batch_predict.rate(1000, 4.0) == 250.0
    assert batch_predict.rate(1000, 0.0) is None
    assert batch_predict.cpu_delta({"a": 1.0, "b": 2.0}, {"a": 3.5, "c": 9.0}) == {"a": 2.5}
