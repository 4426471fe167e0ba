"""Fresh process: plain numpy + keras only. bucketlearn and rawrow_lib are blocked from importing."""
import json
import os
import re
import sys
import time
import warnings

sys.modules["bucketlearn"] = None   # any `import bucketlearn` now raises ImportError
sys.modules["rawrow_lib"] = None
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
warnings.simplefilter("always")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402  (the backend keras already loaded)

HERE = os.path.dirname(os.path.abspath(__file__))
variant = sys.argv[1]
path = f"{HERE}/raw_{variant}.keras"
with warnings.catch_warnings(record=True) as caught:
    model = keras.models.load_model(path, safe_mode=True)
print("loaded", os.path.basename(path), os.path.getsize(path), "bytes; warnings at load:",
      [str(w.message)[:120] for w in caught])
with open(f"{HERE}/test_rows.json") as fh:
    data = json.load(fh)
rows, schema = data["rows"], data["schema"]
exp = np.load(f"{HERE}/expected.npz")


def batch(shape2d, as_object):
    out = {}
    for col in schema:
        name, vals = col["name"].replace("/", "_"), rows[col["name"]]
        if col["kind"] == "numeric" and variant == "float":
            # caller-side conversion the float variant needs: "" / "NA" / ... -> NaN
            arr = np.array([to_float(v) for v in vals], np.float32)
        else:
            arr = np.array(vals, dtype=object) if as_object == "object" else np.array(vals, dtype=str)
            if as_object == "bytes":
                arr = np.char.encode(arr, "utf-8")
        out[name] = arr.reshape(-1, 1) if shape2d else arr
    return out


NUM_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def to_float(v):  # the caller-side helper the float variant needs (same rule as ingest)
    if len(v) >= 40 or not NUM_RE.match(v):
        return np.nan
    with np.errstate(over="ignore"):
        f = np.float32(float(v))
    return f if np.isfinite(f) else np.nan


mat_model = keras.Model(model.inputs, model.get_layer("raw_matrix").output)
x = exp["x_test"]


def compare(label, fn, b):
    t = time.time()
    try:
        p = fn(model, b)
    except Exception as exc:
        print(f"{label}: FAILS {type(exc).__name__}: {str(exc)[:90]}")
        return
    dtp = time.time() - t
    m = np.asarray(fn(mat_model, b))
    bad = np.argwhere(~((m == x) | (np.isnan(m) & np.isnan(x))))
    print(f"{label}: n={len(p)} max|p_raw - p_core| = {np.max(np.abs(np.asarray(p) - exp['p_core'])):.3g}; "
          f"matrix cells differing from python encoder: {len(bad)} of {m.size}; {dtp:.2f}s; NaN in probs: "
          f"{bool(np.isnan(p).any())}")
    for r, c in bad[:8]:
        print("   row", r, "col", c, "graph", m[r, c], "python", x[r, c])


to_tf = lambda b: {k: tf.constant(v) for k, v in b.items()}  # noqa: E731
compare("predict(dict numpy <U (n,1))", lambda mdl, b: mdl.predict(b, verbose=0), batch(True, "unicode"))
compare("predict(dict numpy object)", lambda mdl, b: mdl.predict(b, verbose=0), batch(True, "object"))
compare("predict(dict numpy <U (n,))", lambda mdl, b: mdl.predict(b, verbose=0), batch(False, "unicode"))
compare("predict(dict tf.constant (n,1))", lambda mdl, b: mdl.predict(to_tf(b), verbose=0), batch(True, "unicode"))
compare("predict(dict tf.constant (n,))", lambda mdl, b: mdl.predict(to_tf(b), verbose=0), batch(False, "unicode"))
compare("predict(tf.data batch 64)", lambda mdl, b: mdl.predict(tf.data.Dataset.from_tensor_slices(b).batch(64),
                                                               verbose=0), batch(True, "unicode"))
compare("model(dict numpy <U) __call__", lambda mdl, b: mdl(b).numpy(), batch(True, "unicode"))
compare("model(dict numpy bytes) __call__", lambda mdl, b: mdl(b).numpy(), batch(True, "bytes"))
compare("model(dict numpy object) __call__", lambda mdl, b: mdl(b).numpy(), batch(True, "object"))
# core reloaded inside the raw model vs core on the python-encoded matrix
pc = model.get_layer("core").predict(exp["x_test"], verbose=0)
print(f"nested core (loaded) on python matrix: max|diff| = {np.max(np.abs(pc - exp['p_core'])):.3g}")
core = keras.models.load_model(f"{HERE}/core.keras", safe_mode=True)
print(f"core.keras loaded alone: max|diff| = {np.max(np.abs(core.predict(exp['x_test'], verbose=0) - exp['p_core'])):.3g}")
print("edge rows (first 3) probs:", np.round(model(batch(True, "unicode")).numpy()[:3], 4).tolist())
print("bucketlearn imported:", "bucketlearn" in sys.modules and sys.modules["bucketlearn"] is not None)
