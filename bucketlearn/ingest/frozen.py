"""A continued job's split (``split.split_upload`` handed its parent's manifest): the parent's
columns, kinds, vocabularies, missing-value markers, scaling, label column and classes are kept
as they were, so the continued job's model is the parent's model, trained further, and still
takes the parent's raw rows. Only the rows are the new file's: its holdout, validation rows and
shards are dealt from its own counts as for any upload.

What the new file must have, each refusal naming the column, what was expected and what was
found: the parent's label column and every feature column the parent kept (columns beyond those
are not read); a class label among the parent's classes (its classes may be fewer); a cell of a
numeric column that is a number, as for any upload. Values a category column's vocabulary lacks
take its out-of-vocabulary code, as they do when the parent's model predicts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bucketlearn.domain.columns import Column, Dropped
from bucketlearn.domain.target import REGRESSION
from bucketlearn.ingest.manifest import Manifest
from bucketlearn.ingest.problems import abbrev, rejected
from bucketlearn.options import JobOptions


def frozen_options(options: JobOptions, parent: Manifest) -> JobOptions:
    """``options`` with what decides the columns and the label taken from the parent: its label
    column, missing-value markers and task; no columns left out or kinds forced (the parent's
    kept columns are read, as their kinds)."""
    return dataclasses.replace(options, label_column=parent.label_column,
                               missing_values=",".join(parent.missing_values),
                               task=parent.task, drop_columns="", column_kinds="")


def frozen_features(columns: list[str], parent: Manifest, file: str) -> list[str]:
    """The feature columns the passes read: the parent's kept columns, in its order.

    Raises:
        InvalidInputError: the file lacks the parent's label column or one of its feature
            columns; the problem names the first missing column, the parent's columns and the
            file's.
    """
    wanted = [parent.label_column, *parent.feature_names]
    missing = [name for name in wanted if name not in columns]
    if missing:
        which = "label column" if missing[0] == parent.label_column else "column"
        raise rejected(file, f"a {which} of the model continued from job {parent.job_id} is "
                             "missing", column=missing[0],
                       expected="the columns it was trained on: " + abbrev(", ".join(wanted),
                                                                          200),
                       found=f"no '{abbrev(missing[0])}' among the file's columns: "
                             + abbrev(", ".join(columns), 200))
    return list(parent.feature_names)


def frozen_kinds(parent: Manifest) -> dict[str, str]:
    """How pass 1 reads each feature column: as the parent's kind, not as sniffed."""
    return {column.name: column.kind for column in parent.schema}


def parent_class_ids(classes: list[str], counts: list[int], parent: Manifest, file: str
                     ) -> np.ndarray | None:
    """The parent's class number of each class the file has (pass 1's, in its order), what
    the shards, holdout and validation rows store; None for a numeric target.

    Raises:
        InvalidInputError: a label the parent never saw (its model has no output for it); the
            problem names the labels, their rows, and the parent's classes.
    """
    if parent.task == REGRESSION:
        return None
    index = {name: i for i, name in enumerate(parent.classes)}
    unseen = [(name, n) for name, n in zip(classes, counts, strict=True) if name not in index]
    if unseen:
        raise rejected(file, f"a label the model continued from job {parent.job_id} never saw",
                       column=parent.label_column,
                       expected="labels among its classes: " + abbrev(", ".join(parent.classes),
                                                                      200),
                       found=abbrev(", ".join(f"'{name}' ({n} rows)" for name, n in unseen),
                                    200))
    return np.asarray([index[name] for name in classes], dtype=np.int32)


def frozen_schema(classes: list[str], counts: list[int], parent: Manifest, file: str
                  ) -> tuple[list[Column], list[Dropped], np.ndarray | None]:
    """What the split keeps: the parent's columns, none left out of its own, and the parent's
    class number of each of the file's classes (``parent_class_ids``)."""
    return parent.schema, [], parent_class_ids(classes, counts, parent, file)


def freeze_manifest(manifest: Manifest, parent: Manifest, class_ids: np.ndarray | None) -> None:
    """The continued split's manifest with the parent's columns, scaling and classes (each
    class's rows counted under the parent's class number; 0 for a class the file lacks) or
    numeric target's scaling; its rows, parts and bins are the file's own."""
    manifest.columns, manifest.feature_names = list(parent.columns), list(parent.feature_names)
    manifest.dropped, manifest.missing_values = list(parent.dropped), list(parent.missing_values)
    manifest.mean, manifest.variance = list(parent.mean), list(parent.variance)
    manifest.preprocessing = dict(parent.preprocessing)
    manifest.task = parent.task
    if class_ids is None:
        manifest.target_mean, manifest.target_std = parent.target_mean, parent.target_std
        return

    def as_parents(counts: list[int]) -> list[int]:
        out = [0] * len(parent.classes)
        for own, n in zip(class_ids.tolist(), counts, strict=True):
            out[own] = int(n)
        return out

    manifest.class_counts = as_parents(manifest.class_counts)
    manifest.train_class_counts = as_parents(manifest.train_class_counts)
    manifest.classes, manifest.label_kind = list(parent.classes), parent.label_kind
