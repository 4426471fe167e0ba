"""Main prototype: ingest-encode -> train core 1 epoch -> wrap with raw-row preprocessing -> save
-> reload in a fresh process (safe_mode=True, bucketlearn blocked) -> compare.

Run:  nice -n 10 .venv/bin/python docs/prototypes/rawrow/main.py
"""
import json
import os
import random
import subprocess
import sys
import time
import warnings

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import rawrow_lib as rl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(0)


def rand_number():
    r = rng.random()
    if r < 0.08:
        return rng.choice(rl.MISSING_MARKERS)
    x = rng.gauss(50, 20)
    return rng.choice([f"{x:.3f}", f"{x:.6e}", str(int(x)), f"{x:.1f}", f"+{abs(x):.2f}", repr(x)])


def rand_date(with_time):
    if rng.random() < 0.07:
        return rng.choice(rl.MISSING_MARKERS)
    d = rl.dt.datetime(1950, 1, 1) + rl.dt.timedelta(seconds=rng.randrange(0, 80 * 365 * 86400))
    if not with_time:
        return d.date().isoformat()
    return rng.choice([d.isoformat(), d.isoformat(sep=" "), d.strftime("%Y-%m-%dT%H:%M"),
                       d.strftime("%Y-%m-%dT%H:%M:%S.123Z"), d.strftime("%Y-%m-%d %H:%M:%S+02:00")])


def make_rows(n):
    colors = ["red", "green", "blue", "black", "white", "teal", "Zürich-grün"]
    cities = [f"city_{i:03d}" for i in range(150)]
    cols = {"age": [], "income": [], "color": [], "city": [], "signup": [], "last seen": []}
    y = []
    for _ in range(n):
        cols["age"].append(rand_number())
        cols["income"].append(rand_number())
        cols["color"].append(rng.choice(colors) if rng.random() > 0.05 else rng.choice(["", "NA", "?"]))
        cols["city"].append(rng.choice(cities[: int(rng.paretovariate(1.0) * 5) % 150 + 1]))
        cols["signup"].append(rand_date(False))
        cols["last seen"].append(rand_date(True))
        y.append(rng.randrange(3))
    return cols, np.array(y)


EDGE = {  # never-seen categories, every missing marker, bad numbers/dates, odd formats
    "age": ["", "NA", "NaN", "null", "?", "abc", "1e39", "-0", ".5", "5.", "1,5", " 7", "12345678901234567890"],
    "income": ["1.5e3", "-2.25E-2", "+3", "inf", "nan", "1e-50", "0.1", "3.14159265358979", "7e", "--1", "1.2.3", "", "42"],
    "color": ["purple", "", "NA", "Zürich-grün", "RED", "red ", "?", "null", "teal", "black", "white", "x" * 200, "N/A"],
    "city": ["city_999", "", "city_000", "city_001", "None", "unknown", "city_149", "city_010", "?", "NaN", "c", "city_002", "NULL"],
    "signup": ["2024-02-29", "2023-02-29", "2024-13-01", "1969-12-31", "0001-01-01", "", "NA", "2024/01/01", "20240101", "1900-03-01", "2024-1-01", "2100-12-31", "2024-04-31"],
    "last seen": ["2024-03-15T13:45:07", "2024-03-15 13:45", "2024-03-15T24:00:00", "2024-03-15T13:45:07.999999+05:30",
                  "2024-03-15", "2024-03-15T13:45:60", "2024-03-15T1:45", "", "garbage", "2024-03-15Z", "2024-03-15T13:45:07-08:00", "1955-06-01 00:00:00", "2024-03-15T13"],
}

KINDS = {"age": "numeric", "income": "numeric", "color": "category", "city": "category",
         "signup": "date", "last seen": "datetime"}


def main():
    t0 = time.time()
    train, y_train = make_rows(1500)
    test, _ = make_rows(300)
    for k, v in EDGE.items():
        test[k] = v + test[k]
    schema = rl.fit_schema(train, KINDS, cap=5)  # cap: color keeps 5 of 7 (rest OOV); city keeps 5?
    schema[3]["vocab"] = rl.fit_schema({"city": train["city"]}, {"city": "category"}, cap=100)[0]["vocab"]
    x_train = rl.encode_python(train, schema)
    x_test = rl.encode_python(test, schema)
    print("matrix width", x_train.shape[1], "vocab sizes", [len(c.get("vocab", [])) for c in schema])

    core = rl.build_core(schema, n_classes=3)
    core.fit(x_train, y_train, epochs=1, batch_size=64, verbose=0)
    weights_before = [w.copy() for w in core.get_weights()]
    p_core = core.predict(x_test, verbose=0)
    results = {}
    for variant in ("string", "float"):
        raw = rl.build_raw_model(schema, core, numeric_input=variant)
        path = os.path.join(HERE, f"raw_{variant}.keras")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            raw.save(path)
        same = all(np.array_equal(a, b) for a, b in zip(weights_before, raw.get_layer("core").get_weights(),
                                                          strict=True))
        results[variant] = {"bytes": os.path.getsize(path), "core_weights_identical": same,
                            "n_layers_outer": len(raw.layers),
                            "weights_raw_vs_core": [len(raw.weights), len(core.weights)],
                            "warnings_at_save": [str(w.message)[:100] for w in caught]}
    core.save(os.path.join(HERE, "core.keras"))
    results["core_bytes"] = os.path.getsize(os.path.join(HERE, "core.keras"))
    np.savez(os.path.join(HERE, "expected.npz"), x_test=x_test, p_core=p_core)
    with open(os.path.join(HERE, "test_rows.json"), "w") as f:
        json.dump({"rows": test, "schema": schema}, f)
    print(json.dumps(results, indent=1), f"build+train+save {time.time() - t0:.1f}s")
    for variant in ("string", "float"):
        print(f"--- fresh process, variant={variant}")
        r = subprocess.run([sys.executable, os.path.join(HERE, "check_fresh.py"), variant],
                           capture_output=True, text=True, cwd="/tmp")
        noise = ("absl", "cpu_feature", "rebuild TensorFlow")
        print(r.stdout + "\n".join(line for line in r.stderr.splitlines()
                                    if not any(n in line for n in noise)))


if __name__ == "__main__":
    main()
