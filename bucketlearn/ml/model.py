"""Model builder and export. TensorFlow/Keras is imported lazily: importing bucketlearn is cheap.

The exported ``.keras`` takes raw feature rows in the CSV's column order (normalization is the
model's first layer) and carries ``bucketlearn.json`` inside the archive with the feature names,
the label column and the class names, so ``bucketlearn predict`` returns original label values.
Only built-in layers are used, so ``keras.models.load_model(path)`` works without bucketlearn and
with ``safe_mode=True``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from bucketlearn.domain.columns import Column, is_matrix
from bucketlearn.domain.forecast import ModelCost
from bucketlearn.domain.recipe import RECIPE
from bucketlearn.domain.scaling import Preprocessing
from bucketlearn.domain.target import CLASSIFICATION, REGRESSION
from bucketlearn.errors import InputProblem, InvalidInputError, PermanentError
from bucketlearn.ml import recipe
from bucketlearn.ml.recipe import LABEL_SMOOTHING, LAYERS
from bucketlearn.ml.tabular import build_core, input_names, output_head, raw_row_model

SIDECAR_NAME = "bucketlearn.json"
# What a .keras archive may unpack to before ``predict`` reads it (a zip bomb is refused from
# the sizes its members declare): the sidecar, all members together, and how many there are.
MAX_SIDECAR_BYTES = 1024**2
MAX_ARCHIVE_BYTES = 2 * 1024**3
MAX_ARCHIVE_MEMBERS = 1000


@dataclass(frozen=True)
class ModelSpec:
    """What the model is. A regression model (``task``) has one output, in the
    target's units: a linear unit for the standardized target, then the training rows'
    ``target_mean`` and ``target_std`` undo the standardization (``n_classes`` is 1)."""

    kind: str
    n_features: int
    n_classes: int
    image_shape: tuple[int, int, int] | None
    seed: int
    learning_rate: float
    task: str = CLASSIFICATION
    target_mean: float = 0.0
    target_std: float = 1.0
    # the model and training recipe (``domain.recipe.RECIPE``); 1: a job begun before recipe 2
    recipe: int = 1
    # a recipe-2 MLP's shape, label smoothing and numeric encoding (a search's candidate may
    # change them: ``domain.search.Candidate``)
    width: int = LAYERS[0]
    depth: int = len(LAYERS)
    smoothing: float = LABEL_SMOOTHING
    encoding: bool = True

    @property
    def regression(self) -> bool:
        return self.task == REGRESSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_shape"] = list(self.image_shape) if self.image_shape else None
        if not self.regression:  # a classification job's document as before the option
            for name in ("task", "target_mean", "target_std"):
                data.pop(name)
        if self.recipe == 1:  # a job begun before recipe 2, as its document said
            data.pop("recipe")
        for name in _SHAPE_FIELDS:  # an unsearched job's document as before the search
            if data[name] == getattr(_DEFAULT_SHAPE, name):
                data.pop(name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        shape = data.get("image_shape")
        return cls(kind=data["kind"], n_features=int(data["n_features"]),
                   n_classes=int(data["n_classes"]),
                   image_shape=tuple(shape) if shape else None,  # type: ignore[arg-type]
                   seed=int(data["seed"]), learning_rate=float(data["learning_rate"]),
                   task=str(data.get("task") or CLASSIFICATION),
                   target_mean=float(data.get("target_mean", 0.0)),
                   target_std=float(data.get("target_std", 1.0)),
                   recipe=int(data.get("recipe") or 1),
                **{name: type(getattr(_DEFAULT_SHAPE, name))(data[name])
                   for name in _SHAPE_FIELDS if name in data})


_SHAPE_FIELDS = ("width", "depth", "smoothing", "encoding")
_DEFAULT_SHAPE = ModelSpec("mlp", 1, 1, None, 0, 0.0)


def image_shape_for(n_features: int) -> tuple[int, int, int] | None:
    """A square image layout (h, w, channels) for the feature count, if there is one."""
    for channels in (3, 1):
        if n_features % channels:
            continue
        side = math.isqrt(n_features // channels)
        if side * side * channels == n_features:
            return (side, side, channels)
    return None


def model_kind(requested: str, n_features: int, matrix: bool = True, file: str = "") -> str:
    """Resolve ``auto|mlp|cnn``: auto picks a CNN for square images of side >= 16, else an MLP.

    ``matrix``: every feature is numeric and complete (else only an MLP fits the columns).

    Raises:
        InvalidInputError: a CNN was asked for where none fits.
    """
    if not matrix:
        if requested == "cnn":
            raise InvalidInputError(InputProblem(
                file=file, message="model 'cnn' needs numeric image features",
                expected="only numeric feature columns without missing cells (or model=mlp/auto)",
                found="text, date or missing cells among the feature columns"))
        return "mlp"
    shape = image_shape_for(n_features)
    kind = requested
    if requested == "auto":
        kind = "cnn" if shape is not None and shape[0] >= 16 else "mlp"
    if kind == "cnn" and (shape is None or shape[0] < 4):
        raise InvalidInputError(InputProblem(
            file=file, message="model 'cnn' needs square image features",
            expected="h*h or h*h*3 feature columns with h >= 4 (or model=mlp/auto)",
            found=f"{n_features} feature columns"))
    return kind


def choose_spec(requested: str, n_features: int, n_classes: int, seed: int,
                learning_rate: float, file: str = "", matrix: bool = True,
                target: tuple[float, float] | None = None, recipe: int = RECIPE) -> ModelSpec:
    """The model's spec: its kind (``model_kind``), and for a regression (``target``: the
    training target's mean and standard deviation; None: classes) one output in its units."""
    if target is not None:
        spec = choose_spec(requested, n_features, 1, seed, learning_rate, file, matrix,
                           recipe=recipe)
        return replace(spec, task=REGRESSION, target_mean=float(target[0]),
                       target_std=float(target[1]))
    kind = model_kind(requested, n_features, matrix, file)
    return ModelSpec(kind=kind, n_features=n_features, n_classes=n_classes,
                     image_shape=image_shape_for(n_features) if kind == "cnn" else None,
                     seed=seed, learning_rate=learning_rate, recipe=recipe)


def spec_for(manifest: Any, options: Any, file: str = "", recipe: int = RECIPE) -> ModelSpec:
    """The spec of a split's model (``ingest.manifest.Manifest``) with a job's options: the matrix
    width, the classes or the numeric target, and whether the columns are a plain matrix;
    ``recipe``: the model's recipe (1: the one before recipe 2, which benchmarks compare)."""
    return choose_spec(options.model, manifest.width, len(manifest.classes), options.seed,
                       options.learning_rate, file, matrix=is_matrix(manifest.schema),
                       target=manifest.target, recipe=recipe)


def keras_module() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: PLC0415 - deliberately lazy: TF takes seconds to import

    return keras


def build_model(spec: ModelSpec, mean: list[float], variance: list[float],
                columns: Sequence[Column] = (), preprocessing: dict[str, Any] | None = None
                ) -> Any:
    """Build and compile the Keras model; the same spec and seed give the same initial weights,
    whichever thread builds it and whatever else runs at the same time.

    A recipe-2 MLP (``spec.recipe``) is ``ml.recipe``'s, on the split's ``preprocessing``
    (``domain.scaling.Preprocessing.to_dict``); recipe 1's, and every image model, is built
    here from the training rows' ``mean`` and ``variance``.

    Every kernel initializer has its own seed, derived from the job's: Keras's unseeded
    initializers draw from process-wide random state (Python's ``random`` included), which the
    upload function's other threads (concurrent uploads, client retries with jitter) also draw
    from, so ``set_random_seed`` before a build did not make it reproducible.
    """
    keras = keras_module()
    seeds = itertools.count(spec.seed * 16)
    if spec.recipe >= 2 and spec.kind == "mlp":
        return _recipe_mlp(keras, spec, columns, preprocessing, lambda: next(seeds))
    if columns and not is_matrix(list(columns)):
        inputs, outputs = build_core(keras, columns, spec.n_classes, mean, variance,
                                     lambda: next(seeds), _target(spec))
        model = keras.Model(inputs, outputs, name="bucketlearn_table")
        compile_model(model, spec.learning_rate, spec.task)
        return model

    def init() -> Any:
        return keras.initializers.GlorotUniform(seed=next(seeds))

    inputs = keras.Input(shape=(spec.n_features,), name="features")
    x = keras.layers.Normalization(mean=np.asarray(mean, dtype=np.float32),
                                   variance=np.asarray(variance, dtype=np.float32),
                                   name="normalize")(inputs)
    if spec.kind == "cnn":
        assert spec.image_shape is not None
        x = keras.layers.Reshape(spec.image_shape)(x)
        x = keras.layers.Conv2D(16, 3, activation="relu", padding="same",
                                kernel_initializer=init())(x)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Conv2D(32, 3, activation="relu", padding="same",
                                kernel_initializer=init())(x)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(64, activation="relu", kernel_initializer=init())(x)
    elif spec.kind == "mlp":
        x = keras.layers.Dense(128, activation="relu", kernel_initializer=init())(x)
        x = keras.layers.Dense(64, activation="relu", kernel_initializer=init())(x)
    else:
        raise PermanentError(f"model kind: expected 'mlp' or 'cnn'; found: {spec.kind!r}")
    outputs = output_head(keras, x, spec.n_classes, init, _target(spec))
    model = keras.Model(inputs, outputs, name=f"bucketlearn_{spec.kind}")
    compile_model(model, spec.learning_rate, spec.task)
    return model


def _recipe_mlp(keras: Any, spec: ModelSpec, columns: Sequence[Column],
                preprocessing: dict[str, Any] | None, next_seed: Any) -> Any:
    """Recipe 2's MLP (``ml.recipe``), compiled."""
    if not preprocessing:
        raise PermanentError("a recipe-2 model needs the split's preprocessing; found none in "
                             "the manifest")
    inputs, outputs = recipe.build(keras, list(columns), spec.n_features, spec.n_classes,
                                   Preprocessing.from_dict(preprocessing), next_seed,
                                   _target(spec), (spec.width,) * spec.depth, spec.encoding)
    model = keras.Model(inputs, outputs, name="bucketlearn_mlp2")
    recipe.compile_recipe(keras, model, spec.learning_rate, spec.regression, spec.n_classes,
                          spec.smoothing)
    return model


def _target(spec: ModelSpec) -> tuple[float, float] | None:
    return (spec.target_mean, spec.target_std) if spec.regression else None


def compile_model(model: Any, learning_rate: float, task: str = CLASSIFICATION) -> None:
    """Compile with Adam and build its state now: a version carries the optimizer's state, so
    version 0 needs one before any step. A regression's loss is the mean squared error in the
    target's units: ``target_std**2`` times that of the standardized target the last Dense unit
    predicts (Adam's steps do not depend on that constant factor, up to its epsilon)."""
    keras = keras_module()
    loss, metrics = (("mse", None) if task == REGRESSION
                     else ("sparse_categorical_crossentropy", ["accuracy"]))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate), loss=loss,
                  metrics=metrics)
    model.optimizer.build(model.trainable_variables)


TRAINING_PASSES = 3  # a training step costs about three forward passes (forward, two backward)


def training_flops_per_row(model: Any) -> int:
    """Floating-point operations one training row costs the model, about: a multiply and an
    add per weight a row meets in each Dense and Conv2D layer (a convolution's kernel once per
    output position), times ``TRAINING_PASSES`` (the backward pass computes gradients for the
    inputs and for the weights, each as costly as the forward pass; Kaplan et al. 2020's
    C = 6ND for dense layers). Other layers (normalization, pooling, embeddings) cost far
    less and are left out."""
    flops = 0
    for layer in model.layers:
        kind = type(layer).__name__
        kernel = getattr(layer, "kernel", None)
        if kernel is None or kind not in ("Dense", "Conv2D"):
            continue
        weights = math.prod(int(d) for d in kernel.shape)
        positions = (math.prod(int(d) for d in layer.output.shape[1:-1])
                     if kind == "Conv2D" else 1)
        flops += 2 * weights * positions
    return TRAINING_PASSES * flops


def model_cost(model: Any) -> ModelCost:
    """What the job's forecast needs of ``model`` (``domain.forecast``)."""
    return ModelCost(flops_per_row=training_flops_per_row(model),
                     parameters=int(model.count_params()), layers=len(model.layers))


def export_keras(model: Any, sidecar: dict[str, Any]) -> bytes:
    """Serialize the model to ``.keras`` bytes with ``bucketlearn.json`` inside the archive.

    A model of a table with text, dates or missing cells (``sidecar["inputs"]``) is exported as
    the raw-row model around it (``bucketlearn.ml.tabular``).
    """
    if sidecar.get("inputs"):
        columns = [Column.from_dict(c) for c in sidecar["columns"]]
        model = raw_row_model(keras_module(), model, columns, sidecar.get("missing_values", []))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr(SIDECAR_NAME, json.dumps(sidecar, indent=2))
        with open(path, "rb") as handle:
            return handle.read()


def check_archive_sizes(path: str, archive: zipfile.ZipFile) -> None:
    """Refuse a ``.keras`` archive that would unpack to more than it may (a zip bomb), from
    the sizes its members declare, before anything is decompressed: the sidecar at most
    ``MAX_SIDECAR_BYTES``, all members together at most ``MAX_ARCHIVE_BYTES``, at most
    ``MAX_ARCHIVE_MEMBERS`` of them."""
    members = archive.infolist()
    if len(members) > MAX_ARCHIVE_MEMBERS:
        raise PermanentError(f"{path}: refused the model archive: expected at most "
                             f"{MAX_ARCHIVE_MEMBERS} members; found {len(members)}")
    for member in members:
        if member.filename == SIDECAR_NAME and member.file_size > MAX_SIDECAR_BYTES:
            raise PermanentError(
                f"{path}: refused the model archive: expected its member {SIDECAR_NAME!r} to "
                f"unpack to at most {MAX_SIDECAR_BYTES} bytes; found {member.file_size} bytes")
    total = sum(member.file_size for member in members)
    if total > MAX_ARCHIVE_BYTES:
        largest = max(members, key=lambda m: m.file_size)
        raise PermanentError(
            f"{path}: refused the model archive: expected its members to unpack to at most "
            f"{MAX_ARCHIVE_BYTES} bytes in all; found {total} bytes (the largest, member "
            f"{largest.filename!r}, {largest.file_size} bytes)")


def read_sidecar(path: str) -> dict[str, Any]:
    """The metadata bucketlearn stored inside a ``.keras`` archive, read only after the
    archive's declared sizes are checked (``check_archive_sizes``), and read bounded."""
    try:
        with zipfile.ZipFile(path) as archive:
            check_archive_sizes(path, archive)
            with archive.open(SIDECAR_NAME) as handle:
                data = handle.read(MAX_SIDECAR_BYTES + 1)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError) as exc:
        raise PermanentError(
            f"{path}: expected a .keras model exported by bucketlearn (with {SIDECAR_NAME}); "
            f"found: {exc}") from None
    if len(data) > MAX_SIDECAR_BYTES:  # a member that unpacks to more than it declares
        raise PermanentError(
            f"{path}: refused the model archive: expected its member {SIDECAR_NAME!r} to unpack "
            f"to at most {MAX_SIDECAR_BYTES} bytes; found more")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PermanentError(
            f"{path}: expected a .keras model exported by bucketlearn (with {SIDECAR_NAME}); "
            f"found: {exc}") from None


def load_model(path: str) -> tuple[Any, dict[str, Any]]:
    """Load a ``.keras`` model in safe mode (no lambdas, no pickled code) and its sidecar."""
    sidecar = read_sidecar(path)
    keras = keras_module()
    try:
        model = keras.models.load_model(path, safe_mode=True, compile=False)
    except (ValueError, TypeError, KeyError) as exc:
        # e.g. a Lambda layer: code that safe mode refuses to deserialize. Keras's own message
        # goes on to suggest turning safe mode off; only its first sentence is passed on.
        reason = str(exc).split(". ", 1)[0].strip()
        reason = reason if len(reason) <= 300 else reason[:300] + "…"
        raise PermanentError(
            f"{path}: refused to load the model in safe mode; expected a .keras model of "
            f"built-in layers (as bucketlearn exports); found: {reason}") from None
    return model, sidecar


def model_inputs(manifest_columns: list[dict[str, Any]], markers: list[str]) -> dict[str, Any]:
    """What a sidecar says about the exported model's inputs: nothing for a matrix (one
    ``features`` input in the CSV's column order); per kept column its input name otherwise."""
    columns = [Column.from_dict(c) for c in manifest_columns]
    if not columns or is_matrix(columns):
        return {}
    return {"inputs": input_names(columns), "columns": manifest_columns,
            "missing_values": list(markers)}


def ensemble_model(members: Sequence[Any]) -> Any:
    """One model whose output is the mean of ``members``' outputs (class probabilities, or a
    numeric target in its units) on the same input matrix, each member holding its weights
    as they stand. Built-in layers only: it exports and loads in safe mode as any model here.
    Each member goes in as a model of its own named ``member_<i>`` over the same layers (Keras
    wants the models in one graph named apart); the members themselves are left as they are."""
    keras = keras_module()
    inputs = keras.Input(shape=tuple(members[0].inputs[0].shape[1:]), name="features")
    outputs = []
    for index, member in enumerate(members):
        named = keras.Model(member.input, member.output, name=f"member_{index}")
        outputs.append(named(inputs))
    mean = keras.layers.Average(name="ensemble_mean")(outputs)
    return keras.Model(inputs, mean, name="bucketlearn_ensemble")
