"""training.py: a task's local steps are serial training's steps, and evaluation reads them."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from bucketlearn.ml.model import ModelSpec, build_model
from bucketlearn.ml.training import (
    EVAL_BATCH,
    STEPS_ATTRIBUTE,
    evaluate,
    evaluate_detail,
    optimizer_state,
    shuffle_rows,
    train_task,
)


def _model():
    spec = ModelSpec(kind="mlp", n_features=6, n_classes=3, image_shape=None, seed=5,
                     learning_rate=1e-2)
    return build_model(spec, [0.0] * 6, [1.0] * 6)


def _shard(rows=70):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, rows)
    x = (rng.normal(size=(rows, 6)) + y[:, None]).astype(np.float32)
    return x, y


def test_models_built_at_once_in_threads_start_from_the_seeds_weights():
    """The upload function builds version 0 for concurrent uploads in threads, beside threads
    whose clients draw retry jitter from Python's ``random``; each model must get the initial
    weights its seed gives when built alone (with one ``set_random_seed`` before the build, the
    shared random state interleaved and every one of three differed)."""
    # Prepare
    alone = [w.tobytes() for w in _model().get_weights()]
    built: dict[int, list[bytes]] = {}
    done = threading.Event()

    def build(i):
        built[i] = [w.tobytes() for w in _model().get_weights()]

    def jitter():
        while not done.is_set():
            random.random()
            np.random.random()

    builders = [threading.Thread(target=build, args=(i,)) for i in range(3)]
    noise = threading.Thread(target=jitter)
    # Execute
    noise.start()
    for t in builders:
        t.start()
    for t in builders:
        t.join(timeout=120)
    done.set()
    noise.join(timeout=10)
    # Assert
    assert sorted(built) == [0, 1, 2]
    assert all(built[i] == alone for i in range(3))


def test_task_takes_the_same_steps_as_fit():
    """70 rows in batches of 32 (the last one 6 rows): the weights after a task equal those of
    one fit() epoch over the same reshuffled rows, and the reported loss is fit()'s epoch loss."""
    # Prepare
    x, y = _shard()
    task_model, fit_model = _model(), _model()
    base = [w.copy() for w in task_model.get_weights()]
    xs, ys = shuffle_rows(x, y, seed=3, epoch=2, task_index=4)
    # Execute
    result = train_task(task_model, base, optimizer_state(task_model), x, y, batch_size=32,
                        learning_rates=1e-2, seed=3, epoch=2, task_index=4)
    history = fit_model.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0)
    # Assert
    assert result.examples == 70
    for mine, theirs, start in zip(result.weights, fit_model.get_weights(), base, strict=True):
        assert not np.allclose(mine, start)  # the task trained
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert result.train_loss == pytest.approx(history.history["loss"][-1], rel=1e-4)
    for mine, theirs in zip(result.optimizer, optimizer_state(fit_model), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-7)


def test_two_tasks_from_a_version_state_continue_serial_training():
    """A task that starts from another task's weights *and optimizer state* takes exactly the
    steps one fit() over both tasks' rows takes: a version carries the whole training state, so
    one task per round is serial training (a fresh optimizer per task would not be)."""
    # Prepare
    x, y = _shard(128)
    split_model, fit_model = _model(), _model()
    base = [w.copy() for w in split_model.get_weights()]
    start = optimizer_state(split_model)
    first_rows = shuffle_rows(x[:64], y[:64], seed=0, epoch=1, task_index=0)
    second_rows = shuffle_rows(x[64:], y[64:], seed=0, epoch=1, task_index=1)
    # Execute
    one = train_task(split_model, base, start, x[:64], y[:64], 32, 1e-2, 0, 1, 0)
    other = _model()  # another worker: its own model, given the first task's state
    two = train_task(other, one.weights, one.optimizer, x[64:], y[64:], 32, 1e-2, 0, 1, 1)
    fresh = train_task(_model(), one.weights, start, x[64:], y[64:], 32, 1e-2, 0, 1, 1)
    fit_model.fit(np.concatenate([first_rows[0], second_rows[0]]),
                  np.concatenate([first_rows[1], second_rows[1]]), batch_size=32, epochs=1,
                  shuffle=False, verbose=0)
    # Assert
    for mine, theirs in zip(two.weights, fit_model.get_weights(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert int(two.optimizer[0]) == 4  # four steps in all
    assert any(not np.allclose(a, b, rtol=1e-4, atol=1e-6)
               for a, b in zip(fresh.weights, fit_model.get_weights(), strict=True))


def test_a_task_with_class_weights_takes_fits_weighted_steps():
    """Balanced class weights: the task's steps are fit()'s with each row weighted by its
    class (the compiled loop's weighted signature)."""
    # Prepare
    x, y = _shard(70)
    task_model, fit_model = _model(), _model()
    base = [w.copy() for w in task_model.get_weights()]
    weights = [0.5, 2.0, 1.0]
    xs, ys = shuffle_rows(x, y, seed=0, epoch=1, task_index=0)
    # Execute
    result = train_task(task_model, base, optimizer_state(task_model), x, y, 32, 1e-2, 0, 1, 0,
                        class_weights=weights)
    plain = train_task(_model(), base, optimizer_state(task_model), x, y, 32, 1e-2, 0, 1, 0)
    fit_model.fit(xs, ys, batch_size=32, epochs=1, shuffle=False, verbose=0,
                  sample_weight=np.asarray(weights, np.float32)[ys])
    # Assert
    for mine, theirs in zip(result.weights, fit_model.get_weights(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(result.weights, plain.weights,
                                                      strict=True))


def test_tasks_of_any_row_count_share_one_traced_loop():
    """Tasks of 70, 40 and 33 rows (last batches of 6, 8 and 1 rows) run one compiled loop,
    traced once: train_on_batch traced a graph per batch shape, 0.35 s each."""
    # Prepare
    x, y = _shard(70)
    model = _model()
    state = (model.get_weights(), optimizer_state(model))
    # Execute
    for rows in (70, 40, 33):
        result = train_task(model, *state, x[:rows], y[:rows], 32, 1e-2, 0, 1, rows)
        state = (result.weights, result.optimizer)
    # Assert
    loops = model.__dict__[STEPS_ATTRIBUTE]
    assert len(loops) == 1
    assert next(iter(loops.values())).experimental_get_tracing_count() == 1
    assert int(state[1][0]) == 3 + 2 + 2  # every batch stepped


def test_a_model_whose_weights_were_set_elsewhere_loads_the_task_state_again():
    """A task going on from the model's last end state skips loading it; once an evaluation
    has set other weights in the model, the next task loads its state again and trains as it
    would on a fresh model."""
    # Prepare
    x, y = _shard(70)
    model = _model()
    first = train_task(model, model.get_weights(), optimizer_state(model), x, y, 32, 1e-2,
                       0, 1, 0)
    evaluate(model, [w + 0.5 for w in first.weights], x, y)
    # Execute
    again = train_task(model, first.weights, first.optimizer, x, y, 32, 1e-2, 0, 2, 0)
    fresh = train_task(_model(), first.weights, first.optimizer, x, y, 32, 1e-2, 0, 2, 0)
    # Assert
    for mine, theirs in zip(again.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_task_that_failed_half_way_leaves_no_state_to_skip_loading(monkeypatch):
    """A task that trained and then failed (here: reading its end weights) leaves the model
    half-trained: the next task from the previous end state loads it again and trains as a
    fresh model would, not from what the failed task left."""
    # Prepare
    x, y = _shard(70)
    model = _model()
    first = train_task(model, model.get_weights(), optimizer_state(model), x, y, 32, 1e-2,
                       0, 1, 0)
    working = model.get_weights

    def broken():
        raise RuntimeError("simulated failure after the task's steps")

    monkeypatch.setattr(model, "get_weights", broken)
    with pytest.raises(RuntimeError):
        train_task(model, first.weights, first.optimizer, x, y, 32, 1e-2, 0, 2, 0)
    monkeypatch.setattr(model, "get_weights", working)
    # Execute
    again = train_task(model, first.weights, first.optimizer, x, y, 32, 1e-2, 0, 2, 0)
    fresh = train_task(_model(), first.weights, first.optimizer, x, y, 32, 1e-2, 0, 2, 0)
    # Assert
    for mine, theirs in zip(again.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_task_starts_from_the_base_weights_and_learning_rate():
    """Whatever the model held before, a task starts from the base and state it is given, at
    the learning rate it is given: two tasks from one base on the same rows give the same
    weights; a zero learning rate leaves the weights where they were."""
    # Prepare
    x, y = _shard(40)
    first, second = _model(), _model()
    base = [w.copy() for w in first.get_weights()]
    state = optimizer_state(first)
    second.set_weights([w + 1.0 for w in base])  # a different state left by an earlier task
    # Execute
    a = train_task(first, base, state, x, y, 16, 1e-2, 0, 1, 0)
    b = train_task(second, base, state, x, y, 16, 1e-2, 0, 1, 0)
    still = train_task(second, base, state, x, y, 16, 0.0, 0, 1, 0)
    # Assert
    for wa, wb in zip(a.weights, b.weights, strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)
    for w, start in zip(still.weights, base, strict=True):
        np.testing.assert_allclose(w, start, atol=1e-7)


def test_evaluate_matches_keras_evaluate():
    """The holdout figures are Keras's own: accuracy and cross-entropy as ``model.evaluate``
    reports them, also across more rows than one evaluation batch."""
    # Prepare
    rows = 2 * EVAL_BATCH + 70
    x, y = _shard(rows)
    model = _model()
    train_task(model, model.get_weights(), optimizer_state(model), x[:64], y[:64], 32, 1e-2,
               0, 1, 0)  # weights that are neither initial nor perfect
    # Execute
    accuracy, loss = evaluate(model, None, x, y)
    # Assert
    reference = model.evaluate(x, y, batch_size=256, verbose=0, return_dict=True)
    assert 0.0 < accuracy < 1.0
    assert accuracy == pytest.approx(reference["accuracy"], abs=1e-6)
    assert loss == pytest.approx(reference["loss"], rel=1e-4)


def test_evaluate_sets_the_given_weights_and_rejects_an_empty_holdout():
    # Prepare
    x, y = _shard(50)
    model = _model()
    zeros = [np.zeros_like(w) for w in model.get_weights()]
    # Execute
    accuracy, loss = evaluate(model, zeros, x, y)
    # Assert: all-zero weights give uniform probabilities, so the loss is log(3)
    assert loss == pytest.approx(np.log(3.0), rel=1e-5)
    assert 0.0 <= accuracy <= 1.0
    with pytest.raises(ValueError, match="at least one row"):
        evaluate(model, None, x[:0], y[:0])


def test_evaluate_detail_counts_the_predicted_classes():
    """The predicted-class counts add up to the rows and match the argmax of the model."""
    # Prepare
    x, y = _shard(90)
    model = _model()
    # Execute
    found = evaluate_detail(model, None, x, y)
    # Assert
    predicted = np.argmax(model.predict_on_batch(x), axis=1)
    assert sum(found.predicted_counts) == 90 and len(found.predicted_counts) == 3
    assert found.predicted_counts == np.bincount(predicted, minlength=3).tolist()


def test_a_training_row_costs_three_passes_of_a_multiply_add_per_weight_it_meets():
    """A 5x5x1 image through a 3x3 convolution of 2 filters ('same': 25 positions, 18 kernel
    weights) and a Dense layer from 50 to 3: 2 x (18 x 25 + 150) = 1,200 FLOPs forward, 3,600
    to train; the builder's MLP on 6 features (6-128-64-3): 3 x 2 x 9,152 = 54,912."""
    # Prepare
    import keras

    from bucketlearn.ml.model import model_cost, training_flops_per_row

    inputs = keras.Input((5, 5, 1))
    x = keras.layers.Conv2D(2, 3, padding="same")(inputs)
    x = keras.layers.Flatten()(keras.layers.ReLU()(x))
    small = keras.Model(inputs, keras.layers.Dense(3)(x))
    # Execute / Assert
    assert training_flops_per_row(small) == 3600
    cost = model_cost(_model())
    assert cost.flops_per_row == 54_912
    assert cost.parameters == _model().count_params() and cost.layers == len(_model().layers)
