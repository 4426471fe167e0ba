"""Property-based tests (hypothesis): the CSV reader, its error rows, folding and fold planning.

(a) any small valid numeric CSV splits without losing or duplicating a row, with every class in
    the holdout and every shard holding its share of every class (within one row); for any class
    counts and shard count, the deal plan leaves no shard empty when there are at least as many
    rows as shards, gives every shard floor or ceil of its share of every class and of all rows,
    and keeps each class's rows in shard order;
(b) one corruption of a valid CSV (a non-numeric token, a dropped field, an empty label) always
    raises InvalidInputError naming the corrupted data row, never another exception;
(c) ``domain.fold.fold_round`` adds the round's deltas (so folding two rounds one after the other
    equals folding their union), averages the optimizer states and does not depend on the order
    results arrived in; ``domain.rounds.sort_round`` never folds a task twice or a task already
    done, and folds a round only once every task of it is in.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketlearn.adapters.memory import MemoryBlobStore
from bucketlearn.config import Limits
from bucketlearn.domain.columns import DEFAULT_MISSING_VALUES
from bucketlearn.domain.deal import DealPlan
from bucketlearn.domain.fold import TaskResult, fold_round
from bucketlearn.domain.rounds import DeltaRef, sort_round
from bucketlearn.errors import InvalidInputError
from bucketlearn.ingest.parts import load_parts
from bucketlearn.ingest.split import split_upload
from bucketlearn.options import JobOptions
from tests.unit.helpers import csv_bytes, source_from_bytes

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = settings(max_examples=100, deadline=None)


# --- (a) CSV reader: valid files -----------------------------------------------------------------

@st.composite
def valid_tables(draw: st.DrawFn) -> tuple[list[str], list[list[object]], list[int]]:
    """(header, rows, class of each row): an 'id' feature (unique), 1-5 more, 2-5 classes."""
    n_features = draw(st.integers(2, 6))
    class_sizes = draw(st.lists(st.integers(5, 30), min_size=2, max_size=5))
    labels = [c for c, n in enumerate(class_sizes) for _ in range(n)]
    order = draw(st.permutations(range(len(labels))))
    values = st.floats(-1e6, 1e6, allow_nan=False, width=32)
    rows: list[list[object]] = []
    for row_id, index in enumerate(order):
        features = [repr(float(v)) for v in draw(st.lists(values, min_size=n_features - 1,
                                                          max_size=n_features - 1))]
        rows.append([row_id, *features, f"class-{labels[index]}"])
    header = ["id"] + [f"f{j}" for j in range(1, n_features)] + ["label"]
    return header, rows, [labels[i] for i in order]


@SETTINGS
@given(table=valid_tables(), rows_per_shard=st.integers(8, 64),
       holdout_fraction=st.floats(0.1, 0.4), seed=st.integers(0, 2**31 - 1),
       buffer_bytes=st.sampled_from([512, 4096, 64 * 1024**2]))
def test_split_keeps_every_row_once_with_balanced_shards(table, rows_per_shard, holdout_fraction,
                                                         seed, buffer_bytes) -> None:
    """No row lost or duplicated (each in a shard, the holdout or the validation rows); every
    class in the holdout; shards within ±1 row per class."""
    # Prepare
    header, rows, classes_of_rows = table
    store = MemoryBlobStore()
    options = JobOptions(rows_per_shard=rows_per_shard, holdout_fraction=holdout_fraction,
                         seed=seed)
    # Execute
    manifest = split_upload(source_from_bytes(csv_bytes(header, rows)), store, "work",
                            "prop-000000000000", options, Limits(), buffer_bytes=buffer_bytes)
    # Assert: every row exactly once, with its own label
    k = len(manifest.classes)
    shards = [load_parts(store, "work", s.parts) for s in manifest.shards]
    x_hold, y_hold = load_parts(store, "work", manifest.holdout_parts)
    held = [x_hold] + ([load_parts(store, "work", manifest.validation_parts)[0]]
                       if manifest.validation_parts else [])
    checked = [y_hold] + ([load_parts(store, "work", manifest.validation_parts)[1]]
                          if manifest.validation_parts else [])
    ids = np.concatenate([x[:, 0] for x, _ in shards] + [x[:, 0] for x in held]).astype(np.int64)
    labels = np.concatenate([y for _, y in shards] + checked)
    assert sorted(ids.tolist()) == list(range(len(rows)))
    expected = [manifest.classes.index(f"class-{c}") for c in classes_of_rows]
    np.testing.assert_array_equal(labels[np.argsort(ids)], expected)
    assert manifest.rows == len(rows) == (manifest.train_rows + manifest.holdout_rows
                                          + manifest.validation_rows)
    # every class is in the holdout, and in training
    assert set(np.unique(y_hold).tolist()) == set(range(k))
    train_counts = np.bincount(np.concatenate([y for _, y in shards]), minlength=k)
    assert (train_counts >= 1).all()
    # every shard holds its share of every class, within one row, and is never empty
    per_shard = np.array([np.bincount(y, minlength=k) for _, y in shards])
    share = train_counts / len(shards)
    assert np.all(np.abs(per_shard - share) <= 1.0 + 1e-9), (per_shard, share)
    assert [s.rows for s in manifest.shards] == [len(y) for _, y in shards]
    assert min(len(y) for _, y in shards) >= 1


@SETTINGS
@given(class_sizes=st.lists(st.integers(2, 24), min_size=20, max_size=120),
       rows_per_shard=st.integers(8, 12), seed=st.integers(0, 2**31 - 1))
def test_many_small_classes_leave_no_shard_empty(class_sizes, rows_per_shard, seed) -> None:
    """Classes with fewer training rows than there are shards (the per-class
    deal left a shard empty for ~5 % of seeds): every shard gets floor(N/S) or ceil(N/S) rows and
    at most one row of each class."""
    # Prepare
    rows = [[row, c] for row, c in enumerate(c for c, n in enumerate(class_sizes)
                                             for _ in range(n))]
    store = MemoryBlobStore()
    # (20 or more integer labels: classes only when asked, task=auto would take a number)
    options = JobOptions(rows_per_shard=rows_per_shard, seed=seed, task="classification")
    # Execute
    manifest = split_upload(source_from_bytes(csv_bytes(["id", "label"], rows)), store, "work",
                            "prop-000000000000", options, Limits())
    # Assert
    sizes = [s.rows for s in manifest.shards]
    assert min(sizes) >= 1, sizes
    assert max(sizes) - min(sizes) <= 1
    counts = np.array([np.bincount(load_parts(store, "work", s.parts)[1],
                                   minlength=len(class_sizes)) for s in manifest.shards])
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1)


@FAST
@given(train_per_class=st.lists(st.integers(1, 400), min_size=1, max_size=120),
       data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_deal_plan_leaves_no_shard_empty_and_balances_every_class(train_per_class, data,
                                                                  seed) -> None:
    """For any class counts n_c and shard count S <= N: every shard gets floor(n_c/S) or
    ceil(n_c/S) rows of every class (so per-class counts differ by at most 1 between shards),
    floor(N/S) or ceil(N/S) rows in all (never 0), each class's rows in shard order, and
    DealPlan.sizes() says so."""
    # Prepare
    total = sum(train_per_class)
    shards = data.draw(st.one_of(st.integers(1, min(total, 50)), st.integers(1, total)),
                       label="shards")
    # Execute
    plan = DealPlan.make(train_per_class, shards, seed)
    per_class = []
    for c, n in enumerate(train_per_class):
        shard_of_row = plan.shard_of(c, np.arange(n))
        assert np.all(np.diff(shard_of_row) >= 0), "a class's rows are dealt in shard order"
        per_class.append(np.bincount(shard_of_row, minlength=shards))
    counts = np.array(per_class)
    # Assert
    assert counts.shape == (len(train_per_class), shards)
    n = np.array(train_per_class)[:, None]
    assert np.all((counts == n // shards) | (counts == n // shards + 1))
    assert np.all(counts.max(axis=1) - counts.min(axis=1) <= 1)
    sizes = counts.sum(axis=0)
    assert sizes.min() >= 1
    assert set(sizes.tolist()) <= {total // shards, -(-total // shards)}
    np.testing.assert_array_equal(plan.sizes(), sizes)
    again = DealPlan.make(train_per_class, shards, seed)  # deterministic for a seed
    assert all(np.array_equal(a, b) for a, b in zip(again.extras, plan.extras, strict=True))


# --- (b) CSV reader: one corruption ---------------------------------------------------------------

def _parses_as_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


# (a default missing marker such as 'None' or '?' is a missing cell, not a corruption)
NON_NUMERIC = st.text(
    alphabet=st.characters(whitelist_categories=("L", "N", "P", "S"),
                           blacklist_characters=',"\r\n'),
    min_size=1, max_size=8).filter(lambda t: t.strip() != "" and not _parses_as_number(t)
                                   and t not in DEFAULT_MISSING_VALUES)


@SETTINGS
@given(table=valid_tables(), data=st.data(),
       kind=st.sampled_from(["non_numeric", "drop_field", "empty_label"]))
def test_one_corruption_is_reported_at_its_row(table, data, kind) -> None:
    """InvalidInputError whose problem.row is the corrupted data row (1-based), nothing else."""
    # Prepare
    header, rows, _ = table
    target = data.draw(st.integers(0, len(rows) - 1), label="row index")
    row = [str(v) for v in rows[target]]
    if kind == "non_numeric":
        column = data.draw(st.integers(0, len(row) - 2), label="feature column")
        row[column] = data.draw(NON_NUMERIC, label="token")
    elif kind == "drop_field":
        del row[data.draw(st.integers(0, len(row) - 1), label="dropped field")]
    else:
        row[-1] = data.draw(st.sampled_from(["", " ", "   "]), label="empty label")
    corrupted = [*rows[:target], row, *rows[target + 1:]]
    source = source_from_bytes(csv_bytes(header, corrupted), "corrupt.csv")
    # Execute
    with pytest.raises(InvalidInputError) as excinfo:
        split_upload(source, MemoryBlobStore(), "work", "prop-000000000000",
                     JobOptions(rows_per_shard=8), Limits())
    # Assert
    problem = excinfo.value.problem
    assert problem.row == target + 1, (kind, row, problem)
    assert problem.file == "corrupt.csv"
    assert problem.expected and problem.found
    if kind == "non_numeric":
        assert problem.column == header[column]
    if kind == "empty_label":
        assert problem.column == "label"


# --- (c) fold_round and sort_round ----------------------------------------------------------------

SHAPES = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3)
FINITE = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def layers(draw: st.DrawFn, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    return [np.array(draw(st.lists(FINITE, min_size=r * c, max_size=r * c)),
                     dtype=np.float32).reshape(r, c) for r, c in shapes]


@st.composite
def fold_inputs(draw: st.DrawFn, n_results: int = 2):
    shapes = draw(SHAPES)
    head = draw(layers(shapes))
    optimizer = draw(layers(shapes))
    results = [TaskResult(task_index=i, delta=draw(layers(shapes)),
                          optimizer=draw(layers(shapes)), examples=10)
               for i in range(n_results)]
    return head, optimizer, results


def assert_layers_close(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype == np.float32
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)


@FAST
@given(inputs=fold_inputs())
def test_fold_adds_the_rounds_deltas(inputs) -> None:
    """fold(A and B) == fold(B) applied to fold(A) == head + A + B, up to float32 rounding."""
    # Prepare
    head, optimizer, (a, b) = inputs
    # Execute
    both = fold_round(head, optimizer, [a, b])
    first = fold_round(head, optimizer, [a])
    assert first is not None
    then = fold_round(first[0], optimizer, [b])
    # Assert
    assert both is not None and then is not None
    assert_layers_close(both[0], then[0])
    expected = [h.astype(np.float64) + da.astype(np.float64) + db.astype(np.float64)
                for h, da, db in zip(head, a.delta, b.delta, strict=True)]
    assert_layers_close(both[0], [e.astype(np.float32) for e in expected])
    mean = [(oa.astype(np.float64) + ob.astype(np.float64)) / 2
            for oa, ob in zip(a.optimizer, b.optimizer, strict=True)]
    assert_layers_close(both[1], [m.astype(np.float32) for m in mean])


@FAST
@given(inputs=fold_inputs(n_results=1))
def test_a_round_of_one_task_is_that_tasks_result(inputs) -> None:
    """With one task per round the fold returns the task's own weights and optimizer state:
    the pipeline takes serial training's steps."""
    # Prepare
    head, optimizer, (a,) = inputs
    trained = [h.astype(np.float64) + d.astype(np.float64) for h, d in zip(head, a.delta,
                                                                         strict=True)]
    # Execute
    folded = fold_round(head, optimizer, [a])
    # Assert
    assert folded is not None
    assert_layers_close(folded[0], [t.astype(np.float32) for t in trained])
    for got, want in zip(folded[1], a.optimizer, strict=True):
        np.testing.assert_array_equal(got, want)
    assert fold_round(head, optimizer, []) is None


@FAST
@given(inputs=fold_inputs(n_results=4), data=st.data())
def test_fold_does_not_depend_on_arrival_order(inputs, data) -> None:
    """Any permutation of a round's results folds to the same bytes (the sum runs in task
    order), so the version does not depend on which worker finished first."""
    # Prepare
    head, optimizer, results = inputs
    order = data.draw(st.permutations(range(len(results))))
    # Execute
    straight = fold_round(head, optimizer, results)
    shuffled = fold_round(head, optimizer, [results[i] for i in order])
    # Assert
    assert straight is not None and shuffled is not None
    for x, y in zip(straight[0] + straight[1], shuffled[0] + shuffled[1], strict=True):
        np.testing.assert_array_equal(x, y)


@st.composite
def round_plans(draw: st.DrawFn):
    planned = draw(st.integers(1, 16))
    size = draw(st.integers(1, 6))
    start = draw(st.integers(0, planned - 1))
    round_tasks = list(range(start, min(planned, start + size)))
    done = draw(st.lists(st.integers(0, planned - 1), unique=True, max_size=planned))
    refs = []
    for i in range(draw(st.integers(0, 30))):
        task = draw(st.integers(-2, planned + 2))
        refs.append(DeltaRef(name=f"job/e0001/t{max(task, 0):05d}/{i:016x}.safetensors",
                             task_index=task, failed=draw(st.booleans())))
    return round_tasks, done, refs


@st.composite
def complete_round_plans(draw: st.DrawFn):
    """As ``round_plans``, but every task of the round not yet done has a result or a failure
    marker among the refs (and at least one is not done), so the round plans complete; built
    rather than filtered, which would discard most draws."""
    round_tasks, done, refs = draw(round_plans())
    keep = draw(st.sampled_from(round_tasks))
    done = [t for t in done if t != keep]
    for task in round_tasks:
        if task not in done:
            refs.append(DeltaRef(name=f"job/e0001/t{task:05d}/{len(refs):016x}.safetensors",
                                 task_index=task, failed=draw(st.booleans())))
    return round_tasks, done, draw(st.permutations(refs))


@FAST
@given(args=round_plans())
def test_sort_round_folds_each_task_at_most_once_and_never_a_done_one(args) -> None:
    """results + failures: distinct tasks of the round, none already done; a round is complete
    only when every one of its tasks not yet done has a result or a failure marker."""
    # Prepare
    round_tasks, done, refs = args
    # Execute
    plan = sort_round(round_tasks, done, refs, planned=max(round_tasks) + 1)
    # Assert
    chosen = list(plan.results) + list(plan.failures)
    assert len(chosen) == len(set(chosen)), "a task would be folded twice"
    assert not set(chosen) & set(done), "a task already done would be folded again"
    assert set(chosen) <= set(round_tasks)
    assert all(not r.failed for r in plan.results.values())
    assert all(r.failed for r in plan.failures.values())
    picked = list(plan.results.values()) + list(plan.failures.values())
    assert not any(r is g for r in picked for g in plan.garbage + plan.spares)
    assert sorted(id(r) for r in picked + plan.garbage + plan.ignored + plan.spares) == sorted(
        id(r) for r in refs)
    assert all(r.task_index in chosen for r in plan.spares)  # another object of a chosen task
    assert all(r.task_index in done or not 0 <= r.task_index <= max(round_tasks)
               or r.task_index in round_tasks for r in plan.garbage)
    assert all(r.task_index not in done and r.task_index not in round_tasks
               for r in plan.ignored)
    pending = [t for t in round_tasks if t not in done]
    assert plan.complete == (bool(pending) and set(chosen) == set(pending))


@FAST
@given(args=complete_round_plans())
def test_sort_round_then_commit_never_refolds(args) -> None:
    """Replaying the plan after committing it (a re-delivered event) folds nothing again."""
    # Prepare
    round_tasks, done, refs = args
    first = sort_round(round_tasks, done, refs)
    assert first.complete
    done_after = [*done, *first.results, *first.failures]
    # Execute: the same objects are listed again (not yet garbage-collected)
    second = sort_round(round_tasks, done_after, refs)
    # Assert
    assert not second.results and not second.failures and not second.complete
