#!/usr/bin/env bash
# On the GPU machine: build (Release, all 16 cores), run the whole test suite, and write logs to $OUT.
# Prints a one-line summary last. Usage: scripts/device-test.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${1:-build-gpu}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if ! cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF \
     > "$OUT/configure.log" 2>&1; then
  tail -30 "$OUT/configure.log"; echo "SUMMARY: configure failed"; exit 1
fi
start=$(date +%s)
if ! cmake --build "$BUILD" -j 16 > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -40; echo "SUMMARY: build failed"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

(cd "$BUILD" && ctest --output-on-failure -j 8 --timeout 600) > "$OUT/ctest.log" 2>&1
rc=$?
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest.log" | tail -20
skipped=$(grep -c "Skipped" "$OUT/ctest.log" || true)

"$BUILD/bin/kiln" info --memory > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
echo "SUMMARY: ctest rc=$rc; $(grep -E 'tests passed' "$OUT/ctest.log" | tail -1); skipped: $skipped"
exit $rc
