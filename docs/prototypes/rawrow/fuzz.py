"""Fuzz the in-graph parsers of the *reloaded* raw_string.keras against the Python reference encoder.

Run: nice -n 10 .venv/bin/python docs/prototypes/rawrow/fuzz.py [n]
"""
import json
import os
import random
import struct
import sys
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import rawrow_lib as rl  # noqa: E402
import tensorflow as tf  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
rng = random.Random(1)
CHARS = "0123456789.eE+- -:TZxa,"


def num_str():
    r = rng.random()
    if r < 0.25:   # float64 repr, up to 17 significant digits (what pandas.to_csv writes)
        x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] if rng.random() < 0.2 else \
            rng.gauss(0, 10 ** rng.randint(-12, 12))
        return repr(x)
    if r < 0.45:   # float32 repr
        return str(np.float32(rng.gauss(0, 10 ** rng.randint(-8, 8))))
    if r < 0.75:   # structured random
        s = rng.choice(["", "+", "-"]) + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.6:
            s += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.3:
            s += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 60 if rng.random() < .9 else 999))
        return s
    if r < 0.8:
        return rng.choice(rl.MISSING_MARKERS + ["inf", "-inf", "Infinity", "1_000", "0x1F", " 1", "1 "])
    return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 45)))   # junk, incl. > NUM_LEN


def date_str(with_time):
    r = rng.random()
    y, mo, d = rng.randint(0, 9999), rng.randint(0, 13), rng.randint(0, 32)
    hh, mi, ss = rng.randint(0, 25), rng.randint(0, 60), rng.randint(0, 60)
    if r < 0.6:    # mostly valid dates
        base = rl.dt.date(1, 1, 1) + rl.dt.timedelta(days=rng.randrange(0, 3652058))
        y, mo, d = base.year, base.month, base.day
        hh, mi, ss = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    s = f"{y:04d}-{mo:02d}-{d:02d}"
    if with_time or rng.random() < 0.1:
        s += rng.choice(["T", " ", "t", "_"]) + f"{hh:02d}:{mi:02d}"
        if rng.random() < 0.7:
            s += f":{ss:02d}"
        s += rng.choice(["", "", ".123", ".123456Z", "Z", "+05:30", "-08:00", "x", " ", "5"])
    if rng.random() < 0.1:   # corrupt one character
        i = rng.randrange(len(s))
        s = s[:i] + rng.choice(CHARS) + s[i + 1:]
    if rng.random() < 0.03:
        s = rng.choice(rl.MISSING_MARKERS + ["2024/01/01", "20240101", "2024-1-1"])
    return s


with open(os.path.join(HERE, "test_rows.json")) as fh:
    schema = json.load(fh)["schema"]
model = keras.models.load_model(os.path.join(HERE, "raw_string.keras"), safe_mode=True)
mat_model = keras.Model(model.inputs, model.get_layer("raw_matrix").output)
cols = {"age": [num_str() for _ in range(N)], "income": [num_str() for _ in range(N)],
        "color": [rng.choice(["red", "teal", "", "NA", "purple", "Red"]) for _ in range(N)],
        "city": [f"city_{rng.randrange(200):03d}" for _ in range(N)],
        "signup": [date_str(False) for _ in range(N)], "last seen": [date_str(True) for _ in range(N)]}
t = time.time()
ref = rl.encode_python(cols, schema)
t_py = time.time() - t
ds = tf.data.Dataset.from_tensor_slices({k: np.array(v, dtype=str).reshape(-1, 1) for k, v in cols.items()})
t = time.time()
got = mat_model.predict(ds.batch(4096), verbose=0)
t_graph = time.time() - t
same = (got == ref) | (np.isnan(got) & np.isnan(ref))
off, names = 0, []
for c in schema:
    names += [c["name"]] * rl.WIDTH[c["kind"]]
print(f"N={N} rows; python encoder {t_py:.1f}s, graph {t_graph:.1f}s")
for name in dict.fromkeys(names):
    idx = [i for i, n in enumerate(names) if n == name]
    bad_rows = np.where(~same[:, idx].all(axis=1))[0]
    valid = int(np.isfinite(ref[:, idx[0]]).sum())
    print(f"  {name:10s}: rows differing {len(bad_rows)} / {N} (python-valid values: {valid})")
    for r in bad_rows[:5]:
        print(f"     {cols[name][r]!r}: graph {got[r, idx].tolist()} python {ref[r, idx].tolist()}")
