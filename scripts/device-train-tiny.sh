#!/usr/bin/env bash
# On the GPU machine: train models/kiln-tiny (scripts/train_tiny.py) while kiln builds, then check kiln on it:
# its perplexity of heldout.txt on the CPU and CUDA against transformers' (perplexity.json), and samples.
# The Python documentation's sources come from .deps/pydoc/_sources (carry `.deps`; fill it here with
# `apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb DIR`, then copy
# DIR/usr/share/doc/python3.11/html/_sources there). Logs and the model (kiln-tiny.tgz.part-*, 15 MB pieces:
# `cat kiln-tiny.tgz.part-* | tar xz -C models`) go to $OUT.
#
#   MODEL=models/kiln-tiny scripts/device-train-tiny.sh [train_tiny.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=build-gpu
MODEL=${MODEL:-models/kiln-tiny}
name=$(basename "$MODEL")
rm -rf "$MODEL"
( python3 scripts/train_tiny.py --docs .deps/pydoc/_sources --out "$MODEL" "$@" > "$OUT/train-$name.log" 2>&1
  echo "train_tiny.py: exit $?" >> "$OUT/train-$name.log" ) &
train=$!
t=$(date +%s)
py=()
python3 -c "import nanobind, numpy, pytest" 2> /dev/null && py=(-DKILN_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)")
{ cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF "${py[@]}" $(scripts/device-cmake-args.sh) &&
  cmake --build "$BUILD" -j 12 --target kiln_cli $([ ${#py[@]} -gt 0 ] && echo _kiln); } > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; echo "SUMMARY: build FAILED"; }
echo "== build: $(( $(date +%s) - t )) s"
wait $train
grep -vE "Warning|warn\(|Loading weights|Writing model" "$OUT/train-$name.log" | tail -25
[ -f "$MODEL/model.safetensors" ] || { echo "SUMMARY: training FAILED"; exit 1; }
tar czf - -C "$(dirname "$MODEL")" "$name" | split -b 15M - "$OUT/$name.tgz.part-"
for dev in cpu cuda; do
  "$BUILD/bin/kiln" perplexity -m "$MODEL" --file "$MODEL/heldout.txt" --ctx 512 --device $dev 2>&1 | tail -1
done
python3 -c "import json; p = json.load(open('$MODEL/perplexity.json')); print('transformers:', round(p['perplexity'], 4))"
"$BUILD/bin/kiln" generate -m "$MODEL" -p "The Python interpreter" -n 60 --temp 0 --device cuda 2>&1 | tail -3
"$BUILD/bin/kiln" generate -m "$MODEL" -p "A list is" -n 60 --temp 0.7 --seed 1 --device cpu 2>&1 | tail -3
