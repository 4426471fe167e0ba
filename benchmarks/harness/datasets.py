"""The benchmark datasets: none separable, serial accuracy between about 0.80 and 0.98.

Each dataset is written as a CSV by ``write(name, path, order)``, deterministically (the same
name and order give the same bytes). ``order`` is ``"shuffled"`` (a seeded row permutation) or
``"sorted"`` (rows grouped by label, the worst case for naive sharding).

Image-shaped (28x28x3 pixels, so ``model=auto`` picks the CNN):
  * ``digits28`` — scikit-learn's 8x8 digits (data/digits.csv), each drawn twice into a
    28x28x3 canvas at a random scale (10-20 px), place, colour and background, with pixel noise;
    3,594 rows, 10 classes.
  * ``hmnist4`` — the HMNIST-like generator's idea with four overlapping classes: tinted blobs
    whose centres lie close together, heavy noise, 5 % of labels flipped; 3,000 rows.
  * ``shapes`` — five outlined shapes (circle, square, triangle, cross, ring) of random size,
    place and colour over noise; string labels in the first column, 3 % of labels flipped;
    4,000 rows.
  * ``gratings`` — sinusoidal gratings in six orientations 30 degrees apart, random frequency
    and phase, strong noise; 3,000 rows.

Tabular (the MLP):
  * ``digits`` — data/digits.csv as is (1,797 rows, 64 features, 10 classes).
  * ``blobs12k`` — scikit-learn ``make_classification``: 12,000 rows, 32 features (12
    informative), 5 classes, label mid-row, 5 % of labels flipped.
  * ``wide20`` — ``make_classification``: 10,000 rows, 200 features (40 informative), 20
    classes, 3 % flipped.
  * ``segment`` — UCI Image Segmentation (2,310 rows, 19 features, 7 classes, string labels),
    as shipped inside the ``river`` package.
  * ``banana`` — the Banana set (5,300 rows, 2 features, 2 classes), shipped inside ``river``.
  * ``binary15k`` — ``make_classification``: 15,000 rows, 20 features, 2 classes with a 70/30
    split, 8 % flipped.

``TUNING`` are the datasets any choice of method or setting may look at; ``HELD_OUT`` are run
once, at the end, with the settings the tuning set chose (docs/BENCHMARKS.md reports them apart).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.harness.paths import DIGITS, REPO

SIDE = 28

IMAGE = ("digits28", "hmnist4", "shapes", "gratings")
TABULAR = ("digits", "blobs12k", "wide20", "segment", "banana", "binary15k")
TUNING = ("digits28", "hmnist4", "digits", "blobs12k", "wide20")
HELD_OUT = ("shapes", "gratings", "segment", "banana", "binary15k")
MIXED = ("trips", "penguins")  # text, dates and missing cells; no decision used them
# numeric targets (parity in RMSE); no decision used them
REGRESSION = ("friedman", "trips_tip", "penguins_mass")
REGRESSION_TUNING = ("friedman2", "friedman3")  # for choosing the regression fold only
ORDERS = ("shuffled", "sorted")


# --- writing -----------------------------------------------------------------------------------

def _write(path: Path, header: list[str], rows: np.ndarray, labels: list[str] | np.ndarray,
           order: str, label_first: bool = False, label_at: int | None = None,
           seed: int = 0) -> Path:
    """Write features and labels as a CSV in ``order`` (shuffled or sorted by label)."""
    labels = np.asarray(labels)
    if order == "sorted":
        index = np.argsort(labels, kind="stable")
    elif order == "shuffled":
        index = np.random.default_rng([seed, 99]).permutation(len(labels))
    else:
        raise ValueError(f"order: expected 'shuffled' or 'sorted'; found {order!r}")
    integral = np.issubdtype(rows.dtype, np.integer)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        columns = list(header)
        position = 0 if label_first else (len(columns) if label_at is None else label_at)
        columns.insert(position, "label")
        writer.writerow(columns)
        for i in index:
            values = [str(v) for v in rows[i]] if integral else [f"{v:.6g}" for v in rows[i]]
            values.insert(position, str(labels[i]))
            writer.writerow(values)
    return path


def _digits() -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(DIGITS, delimiter=",", skiprows=1, dtype=np.int64)
    return data[:, :-1], data[:, -1]


def _canvas(images: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """Tint grey images in [0, 1] (n, 28, 28) on random backgrounds; add noise; 0-255 ints."""
    n = len(images)
    fg = rng.uniform(0.4, 1.0, size=(n, 1, 1, 3)) * 255
    bg = rng.uniform(0.0, 0.35, size=(n, 1, 1, 3)) * 255
    rgb = bg + (fg - bg) * images[..., None] + rng.normal(0, noise, size=(n, SIDE, SIDE, 3))
    return np.clip(rgb, 0, 255).astype(np.int64).reshape(n, -1)


def _pixel_header() -> list[str]:
    return [f"pixel{i:04d}" for i in range(SIDE * SIDE * 3)]


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a square image to ``size`` x ``size``."""
    src = image.shape[0]
    coords = (np.arange(size) + 0.5) * src / size - 0.5
    lo = np.clip(np.floor(coords).astype(int), 0, src - 1)
    hi = np.clip(lo + 1, 0, src - 1)
    frac = np.clip(coords - lo, 0, 1)
    rows = image[lo] * (1 - frac)[:, None] + image[hi] * frac[:, None]
    return rows[:, lo] * (1 - frac)[None, :] + rows[:, hi] * frac[None, :]


def _flip(labels: np.ndarray, share: float, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Replace ``share`` of the labels with a random other class."""
    out = labels.copy()
    flip = rng.random(len(labels)) < share
    out[flip] = (labels[flip] + rng.integers(1, classes, size=int(flip.sum()))) % classes
    return out


# --- image-shaped ------------------------------------------------------------------------------

def digits28(path: Path, order: str) -> Path:
    rng = np.random.default_rng(2801)
    pixels, labels = _digits()
    images, out_labels = [], []
    for _copy in range(2):
        for grey, label in zip(pixels, labels, strict=True):
            size = int(rng.integers(14, 21))
            glyph = _resize(grey.reshape(8, 8) / 16.0, size)
            canvas = np.zeros((SIDE, SIDE))
            top, left = (SIDE - size) // 2 + rng.integers(-3, 4, size=2)
            canvas[top:top + size, left:left + size] = glyph
            images.append(canvas)
            out_labels.append(int(label))
    rows = _canvas(np.stack(images), rng, noise=20)
    return _write(path, _pixel_header(), rows, np.array(out_labels), order)


def hmnist4(path: Path, order: str, count: int = 3000) -> Path:
    rng = np.random.default_rng(4404)
    classes = 4
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    centres = 14 + rng.uniform(-3.5, 3.5, size=(classes, 2))
    widths = rng.uniform(3.5, 5.5, size=classes)
    tints = rng.uniform(0.5, 1.0, size=(classes, 3))
    labels = rng.integers(0, classes, size=count)
    shifts = rng.integers(-3, 4, size=(count, 2))
    rows = np.empty((count, SIDE * SIDE * 3), dtype=np.int64)
    for i, c in enumerate(labels):
        cy, cx = centres[c] + shifts[i]
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * widths[c] ** 2))
        image = 70 + 120 * blob[..., None] * tints[c] + rng.normal(0, 45, size=(SIDE, SIDE, 3))
        rows[i] = np.clip(image, 0, 255).astype(np.int64).reshape(-1)
    return _write(path, _pixel_header(), rows, _flip(labels, 0.05, classes, rng), order)


SHAPES = ("circle", "square", "triangle", "cross", "ring")


def _shape(kind: str, size: float, cy: float, cx: float) -> np.ndarray:
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(float)
    dy, dx = yy - cy, xx - cx
    r = np.hypot(dy, dx)
    thick = 1.6
    if kind == "circle":
        return (r <= size).astype(float)
    if kind == "ring":
        return (np.abs(r - size) <= thick).astype(float)
    if kind == "square":
        return ((np.abs(dy) <= size * 0.85) & (np.abs(dx) <= size * 0.85)).astype(float)
    if kind == "cross":
        return (((np.abs(dy) <= thick) & (np.abs(dx) <= size))
                | ((np.abs(dx) <= thick) & (np.abs(dy) <= size))).astype(float)
    if kind == "triangle":  # apex up: inside when below the two slanted edges, above the base
        return ((dy <= size * 0.8) & (dy >= -size) & (np.abs(dx) <= (dy + size) * 0.6)
                ).astype(float)
    raise ValueError(kind)


def shapes(path: Path, order: str, count: int = 4000) -> Path:
    rng = np.random.default_rng(5505)
    labels = rng.integers(0, len(SHAPES), size=count)
    images = np.empty((count, SIDE, SIDE))
    for i, c in enumerate(labels):
        size = rng.uniform(3.5, 8.0)
        cy, cx = rng.uniform(size + 1, SIDE - size - 1, size=2)
        images[i] = _shape(SHAPES[c], size, cy, cx)
    rows = _canvas(images, rng, noise=45)
    names = np.array(SHAPES)[_flip(labels, 0.03, len(SHAPES), rng)]
    return _write(path, _pixel_header(), rows, names, order, label_first=True)


def gratings(path: Path, order: str, count: int = 3000) -> Path:
    rng = np.random.default_rng(6606)
    classes = 6
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(float)
    labels = rng.integers(0, classes, size=count)
    images = np.empty((count, SIDE, SIDE))
    for i, c in enumerate(labels):
        angle = np.pi * c / classes + rng.normal(0, 0.12)
        freq = rng.uniform(0.25, 0.6)
        phase = rng.uniform(0, 2 * np.pi)
        wave = np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)
        images[i] = 0.5 + 0.5 * wave
    rows = _canvas(images, rng, noise=150)
    return _write(path, _pixel_header(), rows, labels, order)


# --- tabular -----------------------------------------------------------------------------------

def digits(path: Path, order: str) -> Path:
    pixels, labels = _digits()
    return _write(path, [f"pixel{i:04d}" for i in range(pixels.shape[1])], pixels, labels, order)


def _classification(path: Path, order: str, **kwargs: object) -> Path:
    from sklearn.datasets import make_classification

    x, y = make_classification(**kwargs)  # type: ignore[arg-type]
    header = [f"f{i:03d}" for i in range(x.shape[1])]
    return _write(path, header, x, y, order, label_at=x.shape[1] // 2)


def blobs12k(path: Path, order: str) -> Path:
    return _classification(path, order, n_samples=12_000, n_features=32, n_informative=12,
                           n_redundant=6, n_classes=5, n_clusters_per_class=2, flip_y=0.05,
                           class_sep=1.0, random_state=1212)


def wide20(path: Path, order: str) -> Path:
    return _classification(path, order, n_samples=10_000, n_features=200, n_informative=40,
                           n_redundant=20, n_classes=20, n_clusters_per_class=1, flip_y=0.03,
                           class_sep=2.5, random_state=2020)


def binary15k(path: Path, order: str) -> Path:
    return _classification(path, order, n_samples=15_000, n_features=20, n_informative=8,
                           n_redundant=4, n_classes=2, n_clusters_per_class=3, weights=[0.7],
                           flip_y=0.08, class_sep=1.0, random_state=1515)


def _river_file(name: str) -> bytes:
    spec = importlib.util.find_spec("river")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'segment' and 'banana' datasets ship inside the 'river' package: "
                           "pip install -e '.[bench]'")
    return (Path(list(spec.submodule_search_locations)[0]) / "datasets" / name).read_bytes()


def segment(path: Path, order: str) -> Path:
    with zipfile.ZipFile(io.BytesIO(_river_file("segment.csv.zip"))) as archive:
        text = archive.read(archive.namelist()[0]).decode()
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    label_at = header.index("category")
    records = [row for row in reader if row]
    features = np.array([[float(v) for i, v in enumerate(row) if i != label_at]
                         for row in records])
    labels = np.array([row[label_at] for row in records])
    names = [h for i, h in enumerate(header) if i != label_at]
    return _write(path, names, features, labels, order)


def banana(path: Path, order: str) -> Path:
    with zipfile.ZipFile(io.BytesIO(_river_file("banana.zip"))) as archive:
        text = archive.read("banana.all.txt").decode()
    records = [line.split() for line in text.splitlines() if line.strip()]  # "-1 1:x1 2:x2"
    features = np.array([[float(item.split(":", 1)[1]) for item in row[1:3]] for row in records])
    labels = np.array([int(row[0]) for row in records])
    return _write(path, ["x1", "x2"], features, labels, order)


def _trips_table(count: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Trips' header, text cells and the noisy score its tip comes from."""
    rng = np.random.default_rng(seed)
    cities = np.array(["Chicago", "Evanston", "Oak Park", "Skokie", "Cicero", "Berwyn"])
    payments = np.array(["Cash", "Credit Card", "Mobile", "Prcard"])
    city, payment = rng.integers(0, 6, count), rng.integers(0, 4, count)
    company = rng.zipf(1.4, count) % 500
    distance = rng.gamma(2.0, 3.0, count)
    hour = rng.integers(0, 24, count)
    stamps = (np.datetime64("2023-01-01T00:00") + rng.integers(0, 730, count).astype(
        "timedelta64[D]") + (hour * 60 + rng.integers(0, 60, count)).astype("timedelta64[m]"))
    score = (np.array([0.8, 0.2, 0.5, -0.2, -0.6, 0.0])[city]
             + np.array([-1.2, 0.6, 0.4, 0.0])[payment] + 0.15 * np.minimum(distance, 12)
             + 0.7 * ((hour >= 17) & (hour <= 20)) + 0.3 * (company < 5)
             + rng.normal(0, 0.6, count))
    blank = rng.random((count, 3)) < np.array([0.06, 0.03, 0.08])
    rows = np.array([[f"T{i:07d}", str(stamps[i]), cities[city[i]],
                      "" if blank[i, 0] else payments[payment[i]], f"Company {company[i]:03d}",
                      "NA" if blank[i, 1] else f"{distance[i]:.2f}",
                      f"{3.25 + 2.25 * distance[i] + rng.normal(0, 1):.2f}",
                      "" if blank[i, 2] else f"{distance[i] * 3 + rng.gamma(2.0, 2.0):.1f}"]
                     for i in range(count)], dtype=object)
    header = ["trip_id", "start", "city", "payment", "company", "miles", "fare", "minutes"]
    return header, rows, score


def trips(path: Path, order: str, count: int = 20_000, seed: int = 5) -> Path:
    """Taxi-trip-like mixed types: an id, a timestamp, three text columns (one of
    500 companies, Zipf-distributed), numbers with empty cells and ``NA``; the tip class comes
    from the city, the payment, the distance and the hour, plus noise (not learned perfectly)."""
    header, rows, score = _trips_table(count, seed)
    labels = np.where(score > 1.3, "high", np.where(score > 0.3, "mid", "low"))
    return _write_text(path, header, rows, labels, order, seed)


def trips_tip(path: Path, order: str, count: int = 20_000, seed: int = 7) -> Path:
    """Trips with a numeric target: the tip in dollars, from the same noisy score
    as ``trips``' class (R² of a perfect model about 0.8: the noise is a fifth of the variance);
    another draw of the rows (seed 7)."""
    header, rows, score = _trips_table(count, seed)
    tips = np.round(np.exp(0.5 * score), 2)
    return _write_text(path, header, rows, tips, order, seed)


def friedman(path: Path, order: str, count: int = 12_000, seed: int = 11) -> Path:
    """Friedman's #1 regression problem (Friedman 1991; scikit-learn's ``make_friedman1``):
    ten features uniform on [0, 1], five of them used,
    y = 10 sin(pi x1 x2) + 20 (x3 - 1/2)^2 + 10 x4 + 5 x5 + N(0, 1); 12,000 rows."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(count, 10))
    y = (10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3]
         + 5 * x[:, 4] + rng.normal(0, 1, count))
    return _write(path, [f"x{i}" for i in range(10)], x, np.round(y, 4), order, seed=seed)


def _friedman_inputs(rng: np.random.Generator, count: int) -> np.ndarray:
    """The four inputs of Friedman's #2 and #3, on scikit-learn's ranges."""
    return np.column_stack([rng.uniform(0, 100, count), rng.uniform(40 * np.pi, 560 * np.pi, count),
                            rng.uniform(0, 1, count), rng.uniform(1, 11, count)])


def friedman2(path: Path, order: str, count: int = 12_000, seed: int = 13) -> Path:
    """Friedman's #2 (scikit-learn's ``make_friedman2``), noise sd 60 (about a fifth of the
    target's sd); 12,000 rows. For choosing the regression fold (``REGRESSION_TUNING``)."""
    rng = np.random.default_rng(seed)
    x = _friedman_inputs(rng, count)
    y = np.sqrt(x[:, 0] ** 2 + (x[:, 1] * x[:, 2] - 1 / (x[:, 1] * x[:, 3])) ** 2)
    y = y + rng.normal(0, 60, count)
    return _write(path, [f"x{i}" for i in range(4)], x, np.round(y, 3), order, seed=seed)


def friedman3(path: Path, order: str, count: int = 12_000, seed: int = 17) -> Path:
    """Friedman's #3 (scikit-learn's ``make_friedman3``), noise sd 0.1; 12,000 rows. For
    choosing the regression fold (``REGRESSION_TUNING``)."""
    rng = np.random.default_rng(seed)
    x = _friedman_inputs(rng, count)
    y = np.arctan((x[:, 1] * x[:, 2] - 1 / (x[:, 1] * x[:, 3])) / x[:, 0])
    y = y + rng.normal(0, 0.1, count)
    return _write(path, [f"x{i}" for i in range(4)], x, np.round(y, 5), order, seed=seed)


def penguins_mass(path: Path, order: str) -> Path:
    """Palmer penguins with a numeric target: ``body_mass_g`` (two rows have it
    ``NA``: left out as missing targets), the species a text feature; 344 rows."""
    header, rows, values = _penguins_without("body_mass_g")
    mass = np.array([float(v) if v not in ("NA", "") else np.nan for v in values])
    labels = np.array(["NA" if np.isnan(m) else f"{m:.0f}" for m in mass], dtype=object)
    order_key = np.nan_to_num(mass, nan=np.inf)  # sorted by the number, missing last
    return _write_text(path, header, rows, labels, order, 0, sort_key=order_key)


def _write_text(path: Path, header: list[str], rows: np.ndarray, labels: np.ndarray, order: str,
                seed: int, sort_key: np.ndarray | None = None) -> Path:
    """Like ``_write`` for cells that are already text (label last); "sorted" sorts by
    ``sort_key`` when given (a numeric target written as text), else by the label."""
    index = (np.argsort(labels if sort_key is None else sort_key, kind="stable")
             if order == "sorted" else np.random.default_rng([seed, 99]).permutation(len(labels)))
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*header, "label"])
        for i in index:
            writer.writerow([*rows[i], labels[i]])
    return path


def penguins(path: Path, order: str) -> Path:
    """Palmer penguins as published (``data/penguins.csv``: text columns, NA cells), the label
    ``species`` moved last; 344 rows."""
    header, rows, labels = _penguins_without("species")
    return _write_text(path, header, rows, np.array(labels), order, 0)


def _penguins_without(column: str) -> tuple[list[str], np.ndarray, list[str]]:
    """``data/penguins.csv`` as published, ``column`` taken out: (the other columns' names,
    their cells, that column's cells)."""
    with open(REPO / "data" / "penguins.csv", encoding="utf-8") as handle:
        records = list(csv.reader(handle))
    header, body = records[0], records[1:]
    at = header.index(column)
    rows = np.array([[v for i, v in enumerate(r) if i != at] for r in body], dtype=object)
    return [h for i, h in enumerate(header) if i != at], rows, [r[at] for r in body]


WRITERS: dict[str, Callable[[Path, str], Path]] = {
    "digits28": digits28, "hmnist4": hmnist4, "shapes": shapes, "gratings": gratings,
    "digits": digits, "blobs12k": blobs12k, "wide20": wide20, "segment": segment,
    "banana": banana, "binary15k": binary15k, "trips": trips, "penguins": penguins,
    "friedman": friedman, "trips_tip": trips_tip, "penguins_mass": penguins_mass,
    "friedman2": friedman2, "friedman3": friedman3,
    "hmnist4-12k": lambda path, order: hmnist4(path, order, 12_000),
    "hmnist4-48k": lambda path, order: hmnist4(path, order, 48_000),
    # the held-out image kinds at the large image set's size (for the long-task layouts)
    "shapes-48k": lambda path, order: shapes(path, order, 48_000),
    "gratings-48k": lambda path, order: gratings(path, order, 48_000),
}


def write(name: str, path: Path, order: str) -> Path:
    """Write dataset ``name`` in ``order`` to ``path``."""
    try:
        writer = WRITERS[name]
    except KeyError:
        raise ValueError(f"dataset: expected one of {', '.join(WRITERS)}; found {name!r}") from None
    return writer(Path(path), order)


