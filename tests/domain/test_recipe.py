"""The default recipe's rules (``domain.recipe``): the budget each ``auto`` becomes, the
validation share, and the selection (the best checkpoint, when to stop)."""

from __future__ import annotations

import pytest

from bucketlearn.domain import recipe as R
from bucketlearn.domain.recipe import Score, Selection, advance, select


@pytest.mark.parametrize(("rows", "batch"), [
    (300, 256), (49_999, 256), (100_000, 512), (270_000, 1024), (10_000_000, 2048)])
def test_the_batch_doubles_with_the_rows_past_fifty_thousand(rows: int, batch: int) -> None:
    assert R.auto_batch(rows, image=False) == batch
    assert R.auto_batch(rows, image=True) == R.CNN_BATCH


def test_the_rate_grows_with_the_square_root_of_the_batch() -> None:
    assert R.auto_learning_rate(256, image=False) == pytest.approx(2e-3)
    assert R.auto_learning_rate(1024, image=False) == pytest.approx(4e-3)
    assert R.auto_learning_rate(R.CNN_BATCH, image=True) == pytest.approx(R.CNN_RATE)


@pytest.mark.parametrize(("rows", "batch", "epochs"), [
    (300, 256, 200),          # 2,000 steps would be 2,000 epochs: capped
    (3_000, 256, 171),        # 2,000 steps of 256 rows
    (43_000, 256, 20),        # 20 passes
    (270_000, 1024, 9),       # 2.4 million rows in all
])
def test_the_epochs_are_a_budget_of_steps_and_rows(rows: int, batch: int, epochs: int) -> None:
    assert R.auto_epochs(rows, batch) == epochs


@pytest.mark.parametrize(("rows", "epochs"), [(2_160, 72), (34_560, 5), (400_000, 1)])
def test_the_image_model_takes_a_fixed_number_of_steps(rows: int, epochs: int) -> None:
    assert R.auto_epochs(rows, R.CNN_BATCH, image=True) == epochs
    assert (epochs - 1) * rows < R.CNN_STEPS * R.CNN_BATCH <= epochs * rows or epochs == 1


@pytest.mark.parametrize(("rows", "batch", "epochs"), [
    (3_000, 256, 43),         # 500 steps of 256 rows (a new job: 171)
    (43_000, 256, 5),         # 5 passes (a new job: 20)
    (270_000, 1024, 3),       # 600,000 rows in all, beyond 500 steps (a new job: 9)
])
def test_a_continued_job_takes_a_quarter_of_a_new_jobs_budget(rows: int, batch: int,
                                                              epochs: int) -> None:
    assert R.auto_epochs(rows, batch, share=R.CONTINUED_SHARE) == epochs
    budget = R.resolve_budget(rows, False, None, batch, None, None, continued=True)
    assert budget.epochs == epochs and "a continued job's" in budget.reasons["epochs"]
    assert budget.patience == R.auto_patience(epochs)
    assert "continued" not in R.resolve_budget(rows, False, None, batch, None, None
                                               ).reasons["epochs"]


def test_a_value_given_is_kept_and_every_auto_says_why() -> None:
    # Execute
    given = R.resolve_budget(5_000, False, epochs=7, batch_size=64, learning_rate=0.01,
                             patience=3)
    auto = R.resolve_budget(5_000, False, None, None, None, None)
    # Assert
    assert (given.epochs, given.batch_size, given.learning_rate, given.patience) == (
        7, 64, 0.01, 3) and given.reasons == {}
    assert (auto.batch_size, auto.epochs, auto.patience) == (256, 103, 26)
    assert set(auto.reasons) == {"epochs", "batch_size", "learning_rate", "patience"}


def test_too_few_rows_hold_none_out_for_validation() -> None:
    assert R.validation_share(99, None)[0] == 0.0
    assert "too few" in R.validation_share(99, None)[1]
    assert R.validation_share(100, None)[0] == R.VALIDATION_FRACTION
    assert R.validation_share(5_000, 0.25) == (0.25, "validation_fraction=0.25 (option)")
    assert R.validation_share(5_000, 0.0)[0] == 0.0


def scores(*accuracies: float) -> list[Score]:
    return [Score(e, 10 * e, accuracy=a, loss=1 - a) for e, a in enumerate(accuracies, 1)]


def test_training_stops_patience_epochs_after_the_best() -> None:
    # Execute
    going = select(scores(0.5, 0.7, 0.6, 0.65), patience=3, epochs=20)
    stopped = select(scores(0.5, 0.7, 0.6, 0.65, 0.69), patience=3, epochs=20)
    # Assert
    assert going.stop_epoch is None and going.best.epoch == 2 and going.scored_through == 4
    assert stopped.stop_epoch == 5 and stopped.best.version == 20


def test_the_last_epoch_ends_selection_and_the_first_of_equals_wins() -> None:
    found = select(scores(0.6, 0.8, 0.8), patience=10, epochs=3)
    assert found.stop_epoch == 3 and found.best.epoch == 2


def test_a_later_epochs_score_waits_for_the_ones_before_it() -> None:
    """Scores may come out of order (a takeover scores a checkpoint the dead holder missed):
    selection walks the epochs in order, so the outcome does not depend on the order."""
    # Prepare
    first, second, third = scores(0.5, 0.9, 0.7)
    # Execute
    early = advance(Selection(), {2: second, 3: third}, patience=5, epochs=10)
    caught_up = advance(early, {1: first, 2: second, 3: third}, patience=5, epochs=10)
    # Assert
    assert early == Selection()
    assert caught_up == select([first, second, third], 5, 10)


def test_a_numeric_target_selects_by_rmse_and_the_state_round_trips() -> None:
    # Execute
    found = select([Score(1, 3, rmse=5.0), Score(2, 6, rmse=4.0), Score(3, 9, rmse=4.5)],
                   patience=1, epochs=10)
    # Assert
    assert found.best.epoch == 2 and found.stop_epoch == 3
    assert Selection.from_dict(found.to_dict(patience=1)) == found
    assert Selection.from_dict(None) == Selection()


def _status(selection: Selection, status: str = "DONE", patience: int = 5) -> dict:
    return {"selection": selection.to_dict(patience), "status": status,
            "model_version": selection.best.version if selection.best else None,
            "validation": "0.1 of each class's training rows"}


def test_the_selection_is_said_in_words_while_running_and_once_stopped() -> None:
    # Prepare: the best at epoch 2, then five epochs without better
    stopped = select(scores(0.8, 0.9, 0.85, 0.85, 0.85, 0.85, 0.85), patience=5, epochs=40)
    running = select(scores(0.8, 0.9, 0.85), patience=5, epochs=40)
    ran_out = select(scores(0.8, 0.9, 0.85), patience=5, epochs=3)
    # Execute
    done = R.selection_sentence(_status(stopped))
    live = R.selection_sentence(_status(running, "RUNNING"))
    full = R.selection_sentence(_status(ran_out))
    # Assert
    assert done == ("version 20, the best by validation: epoch 2 (version 20, 90.0 % on the "
                    "validation rows); stopped after epoch 7, 5 epochs without a better score")
    assert live is not None and live.startswith("the best by validation so far: epoch 2")
    assert full is not None and full.endswith("all 3 epochs trained")


def test_no_selection_says_the_last_version_once_done_and_nothing_before() -> None:
    # Prepare
    none = {"selection": None, "status": "DONE", "model_version": 7,
            "validation": "none: 80 training rows are too few to hold some out"}
    # Execute / Assert
    assert R.selection_sentence(none) == (
        "version 7, the last one trained: no rows were held out for validation")
    assert R.selection_sentence({**none, "status": "RUNNING"}) is None
    held = {**none, "validation": "0.1 of each class's training rows (the best version …)"}
    assert R.selection_sentence(held) is None  # rows were held out: nothing scored to say
    rmse = select([Score(1, 4, rmse=2.5)], patience=5, epochs=1)
    assert "RMSE 2.5 on the validation rows" in str(R.selection_sentence(_status(rmse)))
