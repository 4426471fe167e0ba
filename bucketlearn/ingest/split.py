"""Ingestion: stream an uploaded CSV, validate it, deal its rows into stratified shards + holdout.

Two streaming passes over the file, each holding a few pyarrow blocks at a time (4 MiB blocks,
at most ``READ_AHEAD_BLOCKS`` read ahead of the batch being processed: ``readahead``); an upload
whose parsed batches fit in ``Limits.keep_parsed_bytes`` (held compact once they would not fit
as parsed) is parsed once, pass 2 taking pass 1's batches (``scan.ParsedBatches``) instead of
reading it again:

1. *Scan*: parse every row (structure, UTF-8); count rows per class, profile the feature columns.
2. *Deal*: convert features to float32, check they are finite, and send each row either to the
   holdout (a systematic, per-class sample: exactly ``round(f * n_c)`` rows of every class) or to
   a training shard, following a ``DealPlan`` made from the class counts alone. With ``S`` shards
   and ``n_c = q_c * S + r_c`` training rows of class ``c``, every shard gets ``q_c`` rows of
   class ``c`` and ``r_c`` shards get one more; those extra rows are dealt round-robin over all
   classes (so every shard gets ``floor(N / S)`` or ``ceil(N / S)`` rows in all, and none is
   empty when there are at least as many rows as shards), through a golden-ratio stride that
   spreads each class's extra rows evenly over the shards. A shard's rows of a class are
   contiguous in file order and shard ``k`` takes them from about ``k / S`` of the way through
   the class, whatever the file's order (a CSV sorted by label included); in a shuffled file the
   shards are therefore complete, and written, one after the other.

A row longer than a block makes pyarrow fail ("straddles two block boundaries"); pass 1 then
starts again with blocks of ``2 x max_line_bytes`` (enough for any row within the limit), and
pass 2 uses the block size pass 1 succeeded with.

Shard rows are buffered per shard and written as parts when a shard is complete or when the
buffers reach ``buffer_bytes``; parts are packed, in the order written, into objects of about
``Limits.pack_bytes`` (4 MiB), and the manifest gives each part's object and byte range. Packs
are written a few at once behind the deal (``parts.PartWrites``, a quarter of ``buffer_bytes``
in flight), all of them before the manifest. Memory is therefore bounded whatever the file's
size (invariant 5): the buffers, the writes in flight, and pass 1's batches while they are kept
(at most ``keep_parsed_bytes``; past that the upload is read again instead). A shard may end up
as several parts; the manifest lists them.

Any problem ends in ``InvalidInputError`` whose ``InputProblem`` names the file, the data row
(1-based, header excluded) and the column, what was expected and what was found.

This module holds pass 2 and the entry, ``split_upload``; the rest lives by what it does:
``sniff`` (the file as a whole, its header), ``stream`` (the upload, its batches, the line-by-line
diagnosis of a bad row), ``scan`` (pass 1), ``bucketlearn.domain.deal`` (the holdout and the
deal, from the counts alone), ``parts`` (the part objects, written and read) and ``manifest``
(what the split produced).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from bucketlearn import layout
from bucketlearn.config import Limits
from bucketlearn.domain import scaling
from bucketlearn.domain.columns import CATEGORY, Column, Dropped, decide_columns, matrix_width
from bucketlearn.domain.deal import SplitPlan, Unsplittable, holdout_mask, plan_split
from bucketlearn.domain.plan import check_shard_bytes
from bucketlearn.domain.target import bin_edges, bin_of
from bucketlearn.ingest import stream
from bucketlearn.ingest.columns import Encoder
from bucketlearn.ingest.frozen import (
    freeze_manifest,
    frozen_features,
    frozen_kinds,
    frozen_options,
    frozen_schema,
)
from bucketlearn.ingest.manifest import Manifest, Shard
from bucketlearn.ingest.parts import HoldoutWriter, PartWrites, ShardWriter
from bucketlearn.ingest.problems import abbrev, changed_while_read, rejected
from bucketlearn.ingest.scan import Scan, count_pass
from bucketlearn.ingest.sniff import choose_label_column, read_header
from bucketlearn.ingest.statistics import RowSample, RunningStats
from bucketlearn.ingest.stream import (
    READ_BLOCK_BYTES,
    Progress,
    Reading,
    SourceFile,
    diagnose,
    diagnosed,
    first_non_finite,
)
from bucketlearn.options import JobOptions
from bucketlearn.ports import BlobStore

log = logging.getLogger(__name__)

DEFAULT_BUFFER_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Outline:
    """What pass 1 decided, before pass 2 writes anything: the training rows of each shard,
    the kept columns, and whether the label is a numeric target. A caller's ``check`` may
    refuse the job from it (its total tasks, its model's size) before the expensive pass."""

    shard_rows: list[int]
    schema: list[Column]
    regression: bool
HOLDOUT_PART_BYTES = 16 * 1024**2


def _class_key(value: str, label_kind: str) -> str | None:
    """The class name a label value counts as (None: not an integer in an integer-label file)."""
    if label_kind != "int":
        return value.strip()
    try:
        return str(int(value))
    except ValueError:
        return None


def _class_ids(labels: pa.Array, class_index: dict[str, int], label_kind: str, file: str,
               row_offset: int, label: str) -> np.ndarray:
    """Class numbers of a batch's labels (int32), looking up each distinct label once.

    A label the first pass did not count means the file is not the one that pass read.
    """
    encoded = labels.dictionary_encode()
    ids = np.zeros(len(encoded.dictionary), dtype=np.int32)
    for position, value in enumerate(encoded.dictionary.to_pylist()):
        key = _class_key(value, label_kind)
        if key not in class_index:
            indices = encoded.indices.to_numpy(zero_copy_only=False)
            row = row_offset + int(np.flatnonzero(indices == position)[0]) + 1
            raise changed_while_read(file, f"label {abbrev(value)!r}, which the first pass did "
                                           "not see", row=row, column=label)
        ids[position] = class_index[key]
    return ids[encoded.indices.to_numpy(zero_copy_only=False)]


def _split_plan(scan: Scan, schema: list[Column], file: str, label: str, options: JobOptions,
                limits: Limits, check: Callable[[Outline], None] | None = None) -> SplitPlan:
    """``plan_split`` of pass 1's counts with the job's options, its shards checked to fit
    (``_shards_that_fit``), then its outline by ``check``.

    Raises:
        InvalidInputError: a class with one row, too few rows, too many shards, or shards too
            large; the problem names the numbers and what to change.
    """
    planned = plan_split(scan.classes, scan.class_counts, scan.label_kind,
                         options.holdout_fraction, options.rows_per_shard, options.seed,
                         limits.max_tasks_per_epoch, options.validation_share)
    if isinstance(planned, Unsplittable):
        raise rejected(file, planned.message, column=label if planned.of_label else None,
                       expected=planned.expected, found=planned.found)
    plan = _shards_that_fit(planned, schema, file, options, limits)
    if check is not None:
        check(Outline([int(n) for n in plan.deal.sizes()], schema, scan.targets is not None))
    return plan


def _shards_that_fit(plan: SplitPlan, schema: list[Column], file: str, options: JobOptions,
                     limits: Limits) -> SplitPlan:
    """``plan`` when its largest shard's arrays fit ``limits.max_shard_bytes`` (checked before
    any shard is written).

    Raises:
        InvalidInputError: they would not; the problem names the numbers and what to change.
    """
    over = check_shard_bytes(int(plan.deal.sizes().max()), matrix_width(schema),
                             limits.max_shard_bytes, options.rows_per_shard)
    if over is not None:
        raise rejected(file, over.message, expected=over.expected, found=over.found)
    return plan


class _Dealer:
    """Pass 2's bookkeeping: which rows of a batch are held out, held out for validation, and
    which shard the others go to.

    Rows of class ``c`` are numbered in file order; the holdout mask, the validation mask (over
    the class's rows not held out) and the deal plan decide from those numbers alone, so the
    result does not depend on how the file is cut into batches.
    """

    def __init__(self, plan: SplitPlan, fraction: float, file: str, label: str) -> None:
        self.plan, self.fraction, self.file, self.label = plan, fraction, file, label
        self.seen = np.zeros(len(plan.classes), dtype=np.int64)
        self.seen_kept = np.zeros(len(plan.classes), dtype=np.int64)  # not held out
        self.seen_train = np.zeros(len(plan.classes), dtype=np.int64)

    def deal(self, y: np.ndarray, row_offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(is_holdout, is_validation, shard_of_row) for a batch's class ids; -1 for rows held
        out either way. A row of class -1 (a regression row without a target) is none of them."""
        counts, plan = self.plan.class_counts, self.plan
        is_holdout = np.zeros(len(y), dtype=bool)
        is_validation = np.zeros(len(y), dtype=bool)
        shard_of_row = np.full(len(y), -1, dtype=np.int64)
        for c in np.unique(y):
            if c < 0:
                continue
            rows_c = np.nonzero(y == c)[0]
            if self.seen[c] + len(rows_c) > counts[c]:
                raise changed_while_read(
                    self.file, f"more than the {counts[c]} rows of class "
                               f"{abbrev(self.plan.classes[c])!r} the first pass counted",
                    row=row_offset + int(rows_c[counts[c] - self.seen[c]]) + 1, column=self.label)
            j = self.seen[c] + np.arange(len(rows_c))
            hold = holdout_mask(j, self.fraction, self.plan.hold_phase[c])
            self.seen[c] += len(rows_c)
            is_holdout[rows_c[hold]] = True
            kept = rows_c[~hold]
            if plan.val_share is not None and plan.val_share[c] > 0:
                j_kept = self.seen_kept[c] + np.arange(len(kept))
                validate = holdout_mask(j_kept, plan.val_share[c], plan.val_phase[c])
                is_validation[kept[validate]] = True
                self.seen_kept[c] += len(kept)
                kept = kept[~validate]
            j_train = self.seen_train[c] + np.arange(len(kept))
            self.seen_train[c] += len(kept)
            shard_of_row[kept] = self.plan.deal.shard_of(int(c), j_train)
        return is_holdout, is_validation, shard_of_row

    def check_complete(self) -> None:
        """Pass 2 met exactly the rows pass 1 counted."""
        counts = self.plan.class_counts
        if self.seen.tolist() != list(counts):
            short = next(c for c in range(len(counts)) if self.seen[c] != counts[c])
            raise changed_while_read(
                self.file, f"{self.seen[short]} rows of class {abbrev(self.plan.classes[short])!r}"
                           f" where the first pass counted {counts[short]}", column=self.label)


def _checked_features(source: SourceFile, columns: list[str], label: str, limits: Limits,
                      batch: pa.RecordBatch, encoder: Encoder, reading: Reading,
                      row_offset: int) -> np.ndarray:
    """A batch's feature matrix (float32), or the problem of its first non-finite number."""
    x = encoder.encode(batch)
    found = first_non_finite(x, batch, encoder.columns, row_offset, source.display_name)
    if found is not None:
        problem, quote = found
        # pyarrow turned the text into float32: re-read the row to quote what it said
        # (an overflow such as 1e40 is out of range, not 'inf')
        exact = diagnose(source, columns, label, limits, "", target_row=problem.problem.row,
                         reading=reading) if quote else None
        raise exact or problem
    return x


def _write_train_rows(writer: ShardWriter, x: np.ndarray, y: np.ndarray,
                      shard_of_row: np.ndarray, train: np.ndarray) -> None:
    """Hand a batch's training rows to their shards, grouped by shard."""
    by_shard = train[np.argsort(shard_of_row[train], kind="stable")]
    tx, ty, ts = x[by_shard], y[by_shard], shard_of_row[by_shard]
    bounds = np.flatnonzero(np.diff(ts)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(ts)], strict=False):
        if stop > start:
            writer.add(int(ts[start]), tx[start:stop].copy(), ty[start:stop].copy())


def _batch_labels(batch: pa.RecordBatch, label: str, scan: Scan, class_index: dict[str, int],
                  file: str, row_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(the stratum of each row: class id, or a regression target's bin (-1 without a target);
    what a shard stores as y: the class id, or the float32 target)."""
    if scan.targets is None:
        y = _class_ids(batch.column(label), class_index, scan.label_kind, file, row_offset,
                       label)
        return y, y
    assert scan.bin_starts is not None
    targets, present = scan.targets.read(batch.column(label), row_offset)
    strata = bin_of(scan.targets.buckets(targets), scan.bin_starts)
    strata[~present] = -1
    return strata, targets


@dataclass
class _Sinks:
    """Where pass 2 puts each row: its shard, the holdout or the validation rows; what it adds
    up on the way (the training rows' statistics and sample)."""

    shards: ShardWriter
    holdout: HoldoutWriter
    validation: HoldoutWriter
    stats: RunningStats
    target_stats: RunningStats
    sample: RowSample
    # the class number each row is stored as, by its class in the file (a continued job's: the
    # parent's numbers; None: the file's own)
    relabel: np.ndarray | None = None

    @classmethod
    def make(cls, writes: PartWrites, job_id: str, plan: SplitPlan, width: int,
             buffer_bytes: int, seed: int, relabel: np.ndarray | None = None) -> _Sinks:
        """Writers through ``writes`` (a few parts at once behind the deal, a quarter of
        ``buffer_bytes`` in flight); ``relabel``: the class numbers rows are stored as."""
        held_bytes = max(64 * 1024, min(HOLDOUT_PART_BYTES, buffer_bytes // 4))
        return cls(ShardWriter(writes, job_id, plan.deal.sizes(), buffer_bytes),
                   HoldoutWriter(writes, job_id, held_bytes),
                   HoldoutWriter(writes, job_id, held_bytes, layout.validation_part_path),
                   RunningStats(width), RunningStats(1),
                   RowSample(scaling.sample_rows(width), width, seed), relabel)

    def take(self, x: np.ndarray, y: np.ndarray, strata: np.ndarray, dealt: tuple[np.ndarray,
             np.ndarray, np.ndarray], regression: bool) -> None:
        """One batch's rows, dealt (``_Dealer.deal``)."""
        is_holdout, is_validation, shard_of_row = dealt
        if self.relabel is not None and not regression:
            y = self.relabel[y]
        self.holdout.add(x[is_holdout], y[is_holdout])
        self.validation.add(x[is_validation], y[is_validation])
        train = np.flatnonzero(~is_holdout & ~is_validation & (strata >= 0))
        self.stats.add(x[train])
        self.sample.add(x[train])
        if regression:
            self.target_stats.add(y[train].reshape(-1, 1))
        _write_train_rows(self.shards, x, y, shard_of_row, train)

    def close(self) -> list[Shard]:
        """The shards written (the holdout's and validation's last parts handed over)."""
        shards = self.shards.close()
        self.holdout.flush()
        self.validation.flush()
        return shards

    def address(self, writes: PartWrites, shards: list[Shard]) -> None:
        """List each part by where its pack holds it (``writes`` left: every pack written
        before the manifest lists them)."""
        for shard in shards:
            shard.parts = [writes.address(p) for p in shard.parts]
        for held in (self.holdout, self.validation):
            held.parts = [writes.address(p) for p in held.parts]


def _deal_pass(source: SourceFile, columns: list[str], label: str, limits: Limits, scan: Scan,
               progress: Progress | None, plan: SplitPlan, dealer: _Dealer, encoder: Encoder,
               sinks: _Sinks) -> list[Shard]:
    """Pass 2: check every row, write it to the holdout, the validation rows or its shard;
    the shards written."""
    file = source.display_name
    class_index = {name: i for i, name in enumerate(plan.classes)}
    include = [label, *(c.name for c in encoder.columns)]
    row_offset = 0
    try:
        read = (scan.parsed.drain() if scan.parsed is not None else
                stream.batches(source, columns, label, include, scan.block, scan.reading))
        scan.parsed = None  # the batches not yet dealt go with ``read``, whatever happens
        for batch in read:
            if progress is not None:
                progress()
            x = _checked_features(source, columns, label, limits, batch, encoder, scan.reading,
                                  row_offset)
            strata, y = _batch_labels(batch, label, scan, class_index, file, row_offset)
            sinks.take(x, y, strata, dealer.deal(strata, row_offset), scan.targets is not None)
            row_offset += batch.num_rows
    except pa.ArrowInvalid as exc:
        raise diagnosed(source, columns, label, limits, str(exc), scan.reading) from None
    dealer.check_complete()
    return sinks.close()


def split_upload(source: SourceFile, store: BlobStore, work_bucket: str, job_id: str,
                 options: JobOptions, limits: Limits, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 read_block_bytes: int = READ_BLOCK_BYTES, progress: Progress | None = None,
                 check: Callable[[Outline], None] | None = None,
                 frozen: Manifest | None = None) -> Manifest:
    """Validate and split one uploaded CSV into shards and a holdout in the work bucket: pass 1
    counts the classes and profiles the columns (kinds sniffed from the first block), then
    ``decide_columns`` and ``plan_split`` decide columns, holdout and deal; pass 2
    (``_deal_pass``) encodes the rows and writes each where planned.

    Args:
        source: the upload (name, size, opener for streaming reads).
        store, work_bucket: where shard and holdout parts and the manifest are written.
        job_id: the job the objects belong to (their prefix).
        options: the job's options (label column, shard size, holdout fraction, seed).
        limits: input limits, checked before expensive work; ``keep_parsed_bytes``, within
            which pass 2 takes pass 1's batches (0: never).
        buffer_bytes: memory budget for shard buffers.
        read_block_bytes: the CSV read block to try first (then ``2 x max_line_bytes``).
        progress: called before each record batch of both passes; what it raises ends the split.
        check: called with pass 1's ``Outline`` before pass 2; what it raises ends the split.
        frozen: a continued job's parent's manifest, whose columns it keeps (``ingest.frozen``).

    Returns:
        The manifest (also written to ``jobs/<job>/manifest.json``).

    Raises:
        InvalidInputError: the file cannot be trained on; the problem names row and column.
    """
    file = source.display_name
    columns = read_header(source, limits)
    options = options if frozen is None else frozen_options(options, frozen)
    kept = None if frozen is None else frozen_features(columns, frozen, file)
    label = choose_label_column(columns, options.label_column, file)
    features = kept if kept is not None else _features_read(columns, label, options, file)
    scan = count_pass(source, columns, label, features, limits, options, read_block_bytes,
                      progress, None if frozen is None else frozen_kinds(frozen))
    schema, dropped, relabel = ((*_decide_schema(scan, options, file), None) if frozen is None
                                else frozen_schema(scan.classes, scan.class_counts, frozen, file))
    plan = _split_plan(scan, schema, file, label, options, limits, check)
    encoder = Encoder(schema, options.missing_markers)
    with PartWrites.for_job(store, work_bucket, job_id, buffer_bytes, limits.pack_bytes) as writes:
        sinks = _Sinks.make(writes, job_id, plan, encoder.width, buffer_bytes, options.seed,
                            relabel)
        shard_list = _deal_pass(source, columns, label, limits, scan, progress, plan,
                                _Dealer(plan, options.holdout_fraction, file, label), encoder,
                                sinks)
    sinks.address(writes, shard_list)
    manifest = _manifest(job_id, file, schema, dropped, label, scan, plan, sinks, shard_list,
                         options)
    if scan.targets is not None:
        _as_regression(manifest, scan, plan, sinks.target_stats)
    if frozen is not None:
        freeze_manifest(manifest, frozen, relabel)
    store.write_bytes(work_bucket, layout.manifest_path(job_id), manifest.to_json(),
                      "application/json")
    log.info("split %s: %d rows, %d classes, %d shards, %d holdout rows, %d columns left out",
             file, manifest.rows, len(scan.classes), len(shard_list), manifest.holdout_rows,
             len(dropped))
    return manifest


def _manifest(job_id: str, file: str, schema: list[Column], dropped: list[Dropped],
              label: str, scan: Scan, plan: SplitPlan, sinks: _Sinks, shards: list[Shard],
              options: JobOptions) -> Manifest:
    """The split's manifest: its columns, classes, parts, the training rows' statistics and the
    numeric cells' scaling fitted on their sample (``domain.scaling``)."""
    stats, holdout, validation = sinks.stats, sinks.holdout, sinks.validation
    numeric = [i for i, kind in enumerate(c.kind for c in schema for _ in range(c.width))
               if kind != CATEGORY]
    fitted = scaling.fit(sinks.sample.sample(), numeric)
    return Manifest(
        job_id=job_id, source=file, feature_names=[c.name for c in schema], label_column=label,
        classes=scan.classes, label_kind=scan.label_kind, class_counts=scan.class_counts,
        rows=int(sum(scan.class_counts)), train_rows=plan.train_rows,
        holdout_rows=holdout.rows, shards=shards, holdout_parts=holdout.parts,
        mean=[float(v) for v in stats.mean], variance=[float(v) for v in stats.variance()],
        holdout_part_rows=holdout.part_rows, columns=[c.to_dict() for c in schema],
        dropped=[{"name": d.name, "reason": d.reason} for d in dropped],
        missing_values=options.missing_markers, train_class_counts=list(plan.train_per_class),
        task=scan.task, task_reason=scan.task_reason, validation_rows=validation.rows,
        validation_parts=validation.parts, validation_part_rows=validation.part_rows,
        validation_fraction=plan.validation_fraction, validation_reason=plan.validation_reason,
        preprocessing=fitted.to_dict())


def _as_regression(manifest: Manifest, scan: Scan, plan: SplitPlan,
                   target_stats: RunningStats) -> None:
    """A regression manifest: no classes; the bins, the target's statistics, the rows left out."""
    assert scan.targets is not None and scan.bin_starts is not None
    manifest.classes, manifest.class_counts, manifest.train_class_counts = [], [], []
    manifest.bin_edges = bin_edges(scan.bin_starts, scan.targets.center)[1:]
    manifest.bin_counts = list(scan.class_counts)
    manifest.train_bin_counts = [int(n) for n in plan.train_per_class]
    manifest.target_mean = float(target_stats.mean[0])
    manifest.target_std = float(math.sqrt(target_stats.variance()[0]))
    manifest.missing_targets = scan.targets.missing


def _features_read(columns: list[str], label: str, options: JobOptions, file: str) -> list[str]:
    """The feature columns the passes read: all but the label and those in drop_columns; every
    column ``column_kinds`` names must be one of them."""
    dropped = options.dropped_columns
    unknown = [name for name in dropped if name not in columns]
    if unknown or label in dropped:
        raise rejected(file, "drop_columns names a column the file does not have"
                       if unknown else "drop_columns names the label column",
                       column=(unknown or [label])[0],
                       expected="feature columns of the file: " + abbrev(
                           ", ".join(c for c in columns if c != label), 200),
                       found=", ".join(unknown or [label]))
    features = [c for c in columns if c != label and c not in dropped]
    not_features = [name for name in options.forced_kinds if name not in features]
    if not_features:
        raise rejected(file, "column_kinds names a column that is not a feature column (the "
                             "file lacks it, or it is the label or in drop_columns)",
                       column=not_features[0],
                       expected="feature columns of the file: " + abbrev(", ".join(features),
                                                                        200),
                       found=", ".join(not_features))
    if not features:
        raise rejected(file, "drop_columns leaves no feature column",
                       expected="at least one feature column", found=f"drop_columns={dropped}")
    return features


def _decide_schema(scan: Scan, options: JobOptions, file: str
                   ) -> tuple[list[Column], list[Dropped]]:
    schema, dropped = decide_columns(scan.profiles, options.max_categories,
                                     options.dropped_columns)
    if not schema:
        raise rejected(file, "no feature column can be trained on",
                       expected="at least one feature column that is not empty, constant or "
                                "identifier-like",
                       found="; ".join(f"{d.name}: {d.reason}" for d in dropped)[:300])
    return schema, dropped
