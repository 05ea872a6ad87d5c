#!/usr/bin/env bash
# `pip wheel .` into a scratch folder, the wheel installed into a fresh virtual environment, and the
# Python tests of tensors and DLPack run against the installed package (not the build tree). CI runs this
# after make test, whose compilations ccache then serves.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON3:-python3}
start=$(date +%s)
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/wheels" .
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$work"/wheels/kiln-*.whl numpy pytest
# From an empty folder, so that `import kiln` finds the installed package only.
(cd "$work" && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/python/test_tensor.py" \
   "$OLDPWD/tests/python/test_dlpack.py")
echo "check-pip-install: wheel $(basename "$work"/wheels/kiln-*.whl) built, installed and tested in $(( $(date +%s) - start )) s"
