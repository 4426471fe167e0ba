#!/usr/bin/env bash
# Install checkov into its own virtualenv, .venv-checkov/ at the repository root.
#
# Not in the project's .venv: checkov pins packaging<24 (pytest 9 needs >=24) and ships
# bc-python-hcl2, whose `hcl2` module would shadow python-hcl2. tests/infra/test_terraform.py
# runs .venv-checkov/bin/checkov when it exists and skips the checkov test otherwise.
#
# Usage: tests/infra/install_checkov.sh [PYTHON]   (default: python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${1:-python3}"
VENV="$ROOT/.venv-checkov"
CHECKOV_VERSION="3.3.30"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION"
"$VENV/bin/checkov" --version
