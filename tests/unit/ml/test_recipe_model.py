"""Recipe 2's MLP (``ml.recipe``): built from the split's scaling, trained from class ids with
smoothed one-hot targets, bounded on values it never saw, saved and loaded in safe mode."""

from __future__ import annotations

import numpy as np

from bucketlearn.domain import scaling
from bucketlearn.domain.columns import CATEGORY, NUMERIC, Column
from bucketlearn.ml.model import ModelSpec, build_model, export_keras, keras_module
from bucketlearn.ml.recipe import LABEL_SMOOTHING, one_hot_classes
from bucketlearn.ml.training import optimizer_state, train_task

COLUMNS = [Column("year", NUMERIC), Column("size", NUMERIC, missing=3),
           Column("colour", CATEGORY, vocabulary=("red", "blue"))]


def matrix(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    year = rng.integers(2007, 2010, rows).astype(np.float32)  # three values: degenerate bins
    size = rng.lognormal(3, 1, rows).astype(np.float32)
    size[:3] = np.nan
    colour = rng.integers(0, 4, rows).astype(np.float32)
    y = ((size > 20) ^ (colour == 2)).astype(np.int32)
    return np.stack([year, size, colour], axis=1), y


def recipe_model(x: np.ndarray, seed: int = 3):
    prep = scaling.fit(x, [0, 1])
    spec = ModelSpec(kind="mlp", n_features=3, n_classes=2, image_shape=None, seed=seed,
                     learning_rate=2e-3, recipe=2)
    return build_model(spec, [0.0] * 3, [1.0] * 3, COLUMNS, prep.to_dict())


def test_a_classifier_learns_from_smoothed_one_hot_targets_of_its_class_ids() -> None:
    # Prepare
    x, y = matrix(2000)
    model = recipe_model(x)
    # Execute
    result = train_task(model, model.get_weights(), optimizer_state(model), x, y, 256,
                        [2e-3] * 8, 0, 1, 0)
    probs = model.predict_on_batch(x)
    # Assert
    assert one_hot_classes(model) == 2 and LABEL_SMOOTHING > 0
    assert model.optimizer.beta_2 == 0.95
    assert np.isfinite(result.train_loss) and probs.shape == (2000, 2)
    assert (probs.argmax(1) == y).mean() > 0.6


def test_values_beyond_the_training_range_stay_bounded() -> None:
    """A year after every training year (its bins have no width) and a size a million times
    the largest: the encoding is closed at both ends, so the output stays a probability of the
    scale training saw (it was 710,000 times a bin's width open-ended)."""
    # Prepare
    x, _ = matrix(500)
    model = recipe_model(x)
    extreme = np.array([[2010.0, 1e9, 1.0], [1900.0, -1e9, 0.0], [np.nan, np.nan, 3.0]],
                       np.float32)
    # Execute
    encoded = keras_module().Model(model.inputs, model.get_layer("numeric_encoding").output)
    codes = np.asarray(encoded.predict_on_batch(extreme))
    probs = np.asarray(model.predict_on_batch(extreme))
    # Assert
    assert np.all(np.isfinite(codes)) and np.abs(codes).max() < 100
    assert np.all(np.isfinite(probs)) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)


def test_the_same_seed_builds_the_same_model_and_it_loads_in_safe_mode(tmp_path) -> None:
    # Prepare
    x, _ = matrix(300)
    first, second = recipe_model(x), recipe_model(x)
    path = tmp_path / "m.keras"
    # Execute
    path.write_bytes(export_keras(first, {"feature_names": ["year", "size", "colour"]}))
    loaded = keras_module().models.load_model(str(path), safe_mode=True, compile=False)
    # Assert
    assert [w.tobytes() for w in first.get_weights()] == [
        w.tobytes() for w in second.get_weights()]
    np.testing.assert_allclose(loaded.predict_on_batch(x[:5]), first.predict_on_batch(x[:5]),
                               rtol=1e-6)
