#!/usr/bin/env bash
# Build the Cloud Functions source archive: functions/main.py (the split function's on_upload
# entry point) and functions/requirements.txt at the root, plus a vendored copy of bucketlearn/
# (the function imports it from there). The aggregator is not a function: it runs from the
# worker image (`bucketlearn aggregator`, infra/cloudbuild.yaml builds it).
# The archive is deterministic (sorted entries, fixed timestamps and modes), so the same code
# gives the same MD5 and Terraform does not redeploy the function for nothing.
#
# Usage: infra/package-functions.sh [OUTPUT_ZIP]   (default: infra/.build/functions.zip)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/infra/.build/functions.zip}"
mkdir -p "$(dirname "$OUT")"

python3 - "$ROOT" "$OUT" <<'PY'
import os
import sys
import zipfile

root, out = sys.argv[1], sys.argv[2]
entries = [
    (os.path.join(root, "functions", "main.py"), "main.py"),
    (os.path.join(root, "functions", "requirements.txt"), "requirements.txt"),
]
for base, dirs, files in os.walk(os.path.join(root, "bucketlearn")):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in files:
        if name.endswith((".pyc", ".pyo")):
            continue
        path = os.path.join(base, name)
        entries.append((path, os.path.relpath(path, root)))
for path, _ in entries[:2]:
    if not os.path.isfile(path):
        sys.exit(f"package-functions: missing {path}")
tmp = out + ".tmp"
with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
    for path, arcname in sorted(entries, key=lambda e: e[1]):
        info = zipfile.ZipInfo(arcname.replace(os.sep, "/"), date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(path, "rb") as handle:
            archive.writestr(info, handle.read())
os.replace(tmp, out)
print(f"package-functions: {out} ({len(entries)} files)")
PY
