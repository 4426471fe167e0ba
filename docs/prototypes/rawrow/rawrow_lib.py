"""Prototype: raw-CSV-row .keras export for bucketlearn (built-in Keras layers + keras.ops only).

Layout of the "core matrix" (what ingest writes to shards, float32, one block per column in CSV order):
  numeric   -> 1 cell : the value, NaN if missing/unparseable
  category  -> 1 cell : code 0 = out-of-vocabulary, 1 = missing, 2.. = vocabulary (most frequent first)
  date      -> 5 cells: year, month, day, day-of-week (Mon=0), days since 1970-01-01 (NaN if missing)
  datetime  -> 8 cells: the 5 above + hour, minute, second (wall clock as written; offset ignored)

Python reference encoder (`encode_python`) = what ingest would do. Keras wrapper (`build_raw_model`)
= the same mapping with built-in layers, so raw row -> wrapper -> matrix -> core.
"""
from __future__ import annotations

import calendar
import datetime as dt
import math
import re
from collections import Counter

import numpy as np

MISSING_MARKERS = ["", "NA", "N/A", "NaN", "nan", "null", "NULL", "None", "?"]
NUM_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
DATE_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?(?:[.Z+-].*)?$")
NUM_LEN = 40    # chars the in-graph number parser sees; a longer string is "missing" in both encoders
DATE_LEN = 20   # chars the in-graph date parser looks at (anything after position 19 is ignored)
ONE_HOT_MAX = 16
WIDTH = {"numeric": 1, "category": 1, "date": 5, "datetime": 8}


# ----------------------------------------------------------------------------- reference (ingest)
def parse_number(s: str) -> float:
    if len(s) >= NUM_LEN or not NUM_RE.match(s):
        return math.nan
    with np.errstate(over="ignore"):
        v = np.float32(float(s))
    if abs(v) < np.finfo(np.float32).tiny:   # TF on CPU flushes float32 subnormals to zero: do the same
        v = np.float32(0.0)
    return float(v) if np.isfinite(v) else math.nan


def parse_date(s: str, with_time: bool) -> list[float]:
    m = DATE_RE.match(s)
    n = WIDTH["datetime" if with_time else "date"]
    if not m:
        return [math.nan] * n
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    hh, mi, ss = int(m[4] or 0), int(m[5] or 0), int(m[6] or 0)
    if not (1 <= y and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]
            and hh <= 23 and mi <= 59 and ss <= 59):
        return [math.nan] * n
    day = dt.date(y, mo, d)
    parts = [y, mo, d, day.weekday(), (day - dt.date(1970, 1, 1)).days]
    return [float(p) for p in parts + ([hh, mi, ss] if with_time else [])]


def fit_schema(columns: dict[str, list[str]], kinds: dict[str, str], cap: int) -> list[dict]:
    """Per-column metadata from *training* rows: vocabularies (top `cap`), impute means."""
    schema = []
    for name, values in columns.items():
        kind = kinds[name]
        col = {"name": name, "kind": kind}
        if kind == "category":
            counts = Counter(v for v in values if v not in MISSING_MARKERS)
            col["vocab"] = [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:cap]]
        schema.append(col)
    x = encode_python(columns, schema)
    off = 0
    for col in schema:  # impute value = mean of non-missing training values (per cell)
        w = WIDTH[col["kind"]]
        block = x[:, off:off + w]
        col["fill"] = [float(np.nanmean(block[:, j])) if np.isfinite(block[:, j]).any() else 0.0
                       for j in range(w)]
        filled = np.where(np.isnan(block), np.asarray(col["fill"], np.float32), block)
        col["mean"], col["var"] = filled.mean(0).tolist(), np.maximum(filled.var(0), 1e-6).tolist()
        off += w
    return schema


def encode_python(columns: dict[str, list[str]], schema: list[dict]) -> np.ndarray:
    blocks = []
    for col in schema:
        vals = columns[col["name"]]
        if col["kind"] == "numeric":
            blocks.append(np.array([[parse_number(v)] for v in vals], np.float32))
        elif col["kind"] == "category":
            index = {v: i + 2 for i, v in enumerate(col["vocab"])}
            blocks.append(np.array([[1 if v in MISSING_MARKERS else index.get(v, 0)] for v in vals],
                                   np.float32))
        else:
            blocks.append(np.array([parse_date(v, col["kind"] == "datetime") for v in vals],
                                   np.float32).reshape(len(vals), -1))
    return np.concatenate(blocks, axis=1)


# ----------------------------------------------------------------------------- core model
def build_core(schema: list[dict], n_classes: int, seed: int = 0):
    """Trains on the float32 matrix. Imputation + indicators + one-hot/embedding live here."""
    import keras
    from keras import ops
    keras.utils.set_random_seed(seed)
    width = sum(WIDTH[c["kind"]] for c in schema)
    x = keras.Input(shape=(width,), name="features")
    feats, off = [], 0
    for col in schema:
        w, name = WIDTH[col["kind"]], col["name"]
        block = x[:, off:off + w]
        if col["kind"] == "category":
            code = ops.cast(block, "int32")
            n_tok = len(col["vocab"]) + 2
            if n_tok <= ONE_HOT_MAX:
                feats.append(keras.layers.CategoryEncoding(n_tok, output_mode="one_hot",
                                                           name=f"onehot_{safe(name)}")(code))
            else:
                dim = min(16, math.ceil(1.6 * n_tok ** 0.56))
                e = keras.layers.Embedding(n_tok, dim, name=f"embed_{safe(name)}")(code)
                feats.append(keras.layers.Flatten()(e))
        else:
            nan = ops.isnan(block)
            filled = ops.where(nan, np.asarray(col["fill"], np.float32), block)
            feats.append(keras.layers.Normalization(mean=np.asarray(col["mean"], np.float32),
                                                    variance=np.asarray(col["var"], np.float32),
                                                    name=f"norm_{safe(name)}")(filled))
            feats.append(ops.cast(ops.any(nan, axis=1, keepdims=True), "float32"))  # indicator
        off += w
    h = keras.layers.Concatenate(name="core_concat")(feats)
    h = keras.layers.Dense(16, activation="relu")(h)
    out = keras.layers.Dense(n_classes, activation="softmax", name="probabilities")(h)
    model = keras.Model(x, out, name="core")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


# ----------------------------------------------------------------------------- in-graph parsers
def _digits(c):
    from keras import ops
    return ops.logical_and(c >= 2, c <= 11), c - 2   # vocab starts with "0".."9" -> codes 2..11


def graph_parse_numbers(codes):
    """codes: int32 (batch, k, NUM_LEN) from TextVectorization(vocab NUM_VOCAB). -> float32 (batch, k)."""
    from keras import ops
    L = NUM_LEN
    pos = np.arange(L, dtype=np.int32)
    isd, dv = _digits(codes)
    is_dot, is_e = ops.equal(codes, 12), ops.logical_or(ops.equal(codes, 13), ops.equal(codes, 14))
    is_sign, is_pad, is_oov = ops.logical_or(ops.equal(codes, 15), ops.equal(codes, 16)), ops.equal(codes, 0), ops.equal(codes, 1)
    i32 = lambda b: ops.cast(b, "int32")  # noqa: E731
    length = ops.sum(i32(ops.logical_not(is_pad)), axis=-1, keepdims=True)
    n_e = ops.sum(i32(is_e), axis=-1, keepdims=True)
    e_pos = ops.where(n_e > 0, ops.argmax(i32(is_e), axis=-1)[..., None], length)
    n_dot = ops.sum(i32(is_dot), axis=-1, keepdims=True)
    dot_pos = ops.where(n_dot > 0, ops.argmax(i32(is_dot), axis=-1)[..., None], e_pos)
    in_mant = ops.less(pos, e_pos)
    in_exp = ops.logical_and(ops.greater(pos, e_pos), ops.less(pos, length))
    md, ed = ops.logical_and(isd, in_mant), ops.logical_and(isd, in_exp)
    sign_ok = ops.logical_or(pos == 0, ops.logical_and(ops.equal(pos, e_pos + 1), n_e > 0))
    n_md, n_ed = ops.sum(i32(md), -1, keepdims=True), ops.sum(i32(ed), -1, keepdims=True)
    valid = ops.logical_and(
        ops.logical_not(ops.any(ops.logical_or(is_oov, ops.logical_and(is_sign, ops.logical_not(sign_ok))), axis=-1)),
        ops.logical_and(ops.logical_and(n_e <= 1, n_dot <= 1), n_md >= 1)[..., 0])
    valid = ops.logical_and(valid, ops.logical_or(ops.equal(n_e, 0), n_ed >= 1)[..., 0])
    valid = ops.logical_and(valid, ops.logical_or(ops.equal(n_dot, 0), dot_pos < e_pos)[..., 0])
    valid = ops.logical_and(valid, is_pad[..., L - 1])          # string shorter than NUM_LEN
    table = np.array([10.0 ** k for k in range(23)], np.float64)

    def p10(k):  # exact 10**k (float64) for 0 <= k <= 22, pow() beyond
        k64 = ops.cast(k, "float64")
        return ops.where(k <= 22, ops.take(table, ops.minimum(k, 22)), ops.power(10.0, k64))

    dv64 = ops.cast(dv, "float64")
    k_m = n_md - ops.cumsum(i32(md), axis=-1)                    # mantissa digits after this one
    mant = ops.sum(ops.where(md, dv64 * p10(k_m), 0.0), axis=-1)
    frac = ops.sum(i32(ops.logical_and(md, ops.greater(pos, dot_pos))), axis=-1)
    k_e = ops.minimum(n_ed - ops.cumsum(i32(ed), axis=-1), 9)
    expo = ops.sum(ops.where(ed, ops.cast(dv, "float64") * ops.power(10.0, ops.cast(k_e, "float64")), 0.0), -1)
    e_sign_pos = ops.minimum(e_pos + 1, L - 1)
    e_neg = ops.equal(ops.take_along_axis(codes, e_sign_pos, axis=-1)[..., 0], 16)
    expo = ops.minimum(ops.where(e_neg, -expo, expo), 400.0)
    expo = ops.maximum(expo, -400.0)
    scale = ops.cast(expo, "int32") - frac
    val = ops.where(scale >= 0, mant * p10(ops.maximum(scale, 0)), mant / p10(ops.maximum(-scale, 0)))
    val = ops.where(ops.equal(mant, 0.0), 0.0, val)               # 0e999 is 0, not 0*inf
    val = ops.where(ops.equal(codes[..., 0], 16), -val, val)
    v32 = ops.cast(val, "float32")
    ok = ops.logical_and(valid, ops.isfinite(v32))
    return ops.where(ok, v32, np.float32("nan"))


def _mask(positions, L=None):
    m = np.zeros(L or DATE_LEN, bool)
    m[list(positions)] = True
    return m


def graph_parse_dates(codes):
    """codes: int32 (batch, k, DATE_LEN) from TextVectorization(vocab DATE_VOCAB), all date/datetime
    columns stacked -> float32 (batch, k, 8): year, month, day, dow, epoch-day, hour, minute, second."""
    from keras import ops
    DASH, T, SP, COLON, DOT, Z, PLUS = 12, 13, 14, 15, 16, 17, 18
    isd, dv = _digits(codes)
    sep = np.zeros(DATE_LEN, np.int32)
    sep[[4, 7]], sep[[13, 16]] = DASH, COLON

    def ok(digit_pos, sep_pos):   # all required digits are digits and all separators match
        good = ops.logical_or(ops.logical_not(_mask(digit_pos)), isd)
        if sep_pos:
            good = ops.logical_and(good, ops.logical_or(ops.logical_not(_mask(sep_pos)), ops.equal(codes, sep)))
        return ops.all(good, axis=-1)

    is_tail = ops.logical_or(ops.logical_or(ops.equal(codes, 0), ops.equal(codes, DOT)),
                             ops.logical_or(ops.equal(codes, Z), ops.logical_or(ops.equal(codes, PLUS),
                                                                                ops.equal(codes, DASH))))
    c10 = codes[..., 10]
    hm_ok = ops.logical_and(ok([11, 12, 14, 15], [13]), ops.logical_or(ops.equal(c10, T), ops.equal(c10, SP)))
    case_a = is_tail[..., 10]
    case_b = ops.logical_and(hm_ok, is_tail[..., 16])
    case_c = ops.logical_and(ops.logical_and(hm_ok, ok([17, 18], [16])), is_tail[..., 19])
    w = np.zeros((DATE_LEN, 6), np.float32)   # place values: digits -> y, mo, d, hh, mi, ss
    for col, pos in enumerate([[0, 1, 2, 3], [5, 6], [8, 9], [11, 12], [14, 15], [17, 18]]):
        w[pos, col] = [10.0 ** (len(pos) - 1 - i) for i in range(len(pos))]
    num = ops.cast(ops.matmul(ops.cast(ops.where(isd, dv, 0), "float32"), w), "int32")  # exact: < 2**24
    y, mo, dd = num[..., 0], num[..., 1], num[..., 2]
    has_t = ops.logical_or(case_b, case_c)
    hh, mi = ops.where(has_t, num[..., 3], 0), ops.where(has_t, num[..., 4], 0)
    ss = ops.where(case_c, num[..., 5], 0)
    leap = ops.logical_or(ops.logical_and(ops.equal(y % 4, 0), ops.not_equal(y % 100, 0)), ops.equal(y % 400, 0))
    dim = ops.take(np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int32),
                   ops.clip(mo - 1, 0, 11)) + ops.cast(ops.logical_and(leap, ops.equal(mo, 2)), "int32")
    valid = ops.logical_and(ok([0, 1, 2, 3, 5, 6, 8, 9], [4, 7]), ops.logical_or(case_a, has_t))
    for cond in (y >= 1, mo >= 1, mo <= 12, dd >= 1, dd <= dim, hh <= 23, mi <= 59, ss <= 59):
        valid = ops.logical_and(valid, cond)
    # days_from_civil (H. Hinnant), integer floor arithmetic
    yy = y - ops.cast(mo <= 2, "int32")
    era = ops.floor_divide(yy, 400)
    yoe = yy - era * 400
    doy = ops.floor_divide(153 * ((mo + 9) % 12) + 2, 5) + dd - 1
    doe = yoe * 365 + ops.floor_divide(yoe, 4) - ops.floor_divide(yoe, 100) + doy
    days = era * 146097 + doe - 719468
    dow = (days + 3) % 7
    out = ops.cast(ops.stack([y, mo, dd, dow, days, hh, mi, ss], axis=-1), "float32")
    return ops.where(valid[..., None], out, np.float32("nan"))


NUM_VOCAB = list("0123456789") + [".", "e", "E", "+", "-"]
DATE_VOCAB = list("0123456789") + ["-", "T", " ", ":", ".", "Z", "+"]


# ----------------------------------------------------------------------------- wrapper
def safe(col: str) -> str:  # layer names must match TF scope names ^[A-Za-z0-9_.\\/>-]*$
    return re.sub(r"[^A-Za-z0-9_.-]", "_", col)


def input_name(col: str) -> str:
    return col.replace("/", "_")


def build_raw_model(schema: list[dict], core, numeric_input: str = "string"):
    """Raw row (dict of per-column tensors) -> the core matrix -> core (reused as a layer)."""
    import keras
    from keras import ops
    inputs, blocks = {}, []
    num_tv = keras.layers.TextVectorization(standardize=None, split="character", output_mode="int",
                                            output_sequence_length=NUM_LEN, vocabulary=NUM_VOCAB,
                                            name="num_chars")
    date_tv = keras.layers.TextVectorization(standardize=None, split="character", output_mode="int",
                                             output_sequence_length=DATE_LEN, vocabulary=DATE_VOCAB,
                                             name="date_chars")
    num_cols = [c["name"] for c in schema if c["kind"] == "numeric"]
    for col in schema:
        name = col["name"]
        is_float = col["kind"] == "numeric" and numeric_input == "float"
        inputs[input_name(name)] = keras.Input(shape=(1,), dtype="float32" if is_float else "string",
                                               name=input_name(name))
    parsed = {}
    if num_cols and numeric_input == "string":  # all numeric columns parsed by one vectorized parser
        codes = ops.stack([num_tv(inputs[input_name(n)]) for n in num_cols], axis=1)
        values = graph_parse_numbers(ops.cast(codes, "int32"))          # (batch, k)
        parsed = {n: values[:, i:i + 1] for i, n in enumerate(num_cols)}
    date_cols = [c for c in schema if c["kind"] in ("date", "datetime")]
    if date_cols:   # all date/datetime columns parsed by one vectorized parser
        codes = ops.stack([date_tv(inputs[input_name(c["name"])]) for c in date_cols], axis=1)
        parts = graph_parse_dates(ops.cast(codes, "int32"))               # (batch, k, 8)
        parsed.update({c["name"]: parts[:, i, :WIDTH[c["kind"]]] for i, c in enumerate(date_cols)})
    for col in schema:
        name, kind = col["name"], col["kind"]
        inp = inputs[input_name(name)]
        if kind == "numeric":
            blocks.append(inp if numeric_input == "float" else parsed[name])
        elif kind == "category":
            m = len(MISSING_MARKERS)
            lookup = keras.layers.StringLookup(vocabulary=MISSING_MARKERS + col["vocab"], num_oov_indices=1,
                                               mask_token=None, output_mode="int", name=f"lookup_{safe(name)}")
            idx = ops.cast(lookup(inp), "int32")  # 0 OOV, 1..m markers, m+1.. vocab
            code = ops.where(ops.equal(idx, 0), 0, ops.where(idx <= m, 1, idx - m + 1))
            blocks.append(ops.cast(code, "float32"))
        else:
            blocks.append(parsed[name])
    matrix = keras.layers.Concatenate(name="raw_matrix")(blocks)
    out = core(matrix)
    return keras.Model(inputs, out, name="bucketlearn_raw")
