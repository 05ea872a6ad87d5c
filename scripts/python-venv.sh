#!/usr/bin/env bash
# Creates the virtual environment the Python module's build and tests use (make test): nanobind to build
# the bindings, NumPy and pytest to test them, the OpenAI client to test kiln serve, and gguf (llama.cpp's
# GGUF package) to read the GGUF files kiln writes. Idempotent: a finished environment has DIR/.ready3 (a
# change of the package list below renames the marker, so it is rebuilt).
#   scripts/python-venv.sh DIR
set -euo pipefail
dir=${1:?usage: scripts/python-venv.sh DIR}
[ -f "$dir/.ready3" ] && exit 0
python=${PYTHON3:-python3}
if ! "$python" -c "import venv, ensurepip" 2> /dev/null; then
  echo "python-venv: $python cannot create virtual environments (Debian: apt-get install python3-venv)"
  exit 1
fi
rm -rf "$dir"
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "nanobind>=2.4,<4" numpy pytest openai gguf
touch "$dir/.ready3"
echo "python-venv: $dir ready ($("$dir/bin/python" -c 'import sys, nanobind, numpy; print("Python", sys.version.split()[0], "nanobind", nanobind.__version__, "numpy", numpy.__version__)'))"
