#!/usr/bin/env bash
# On the GPU machine: build and run the whole test suite, then the CUDA tests of a Debug build under
# compute-sanitizer memcheck. Logs go to $OUT (at most 8 files come back from the device machine); a
# summary line comes last.
#
#   scripts/device-test.sh [all|release|sanitizer]     (default: all)
#   KILN_PERF=1     also time every CUDA conformance case (perf.log)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
MODE=${1:-all}
BUILD=build-gpu
DBG=build-gpu-debug
summary=()

release() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    nvcc --version | tail -1
  } > "$OUT/info.txt" 2>&1
  cat "$OUT/info.txt"
  local start=$(date +%s)
  if ! { cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF &&
         cmake --build "$BUILD" -j 16; } > "$OUT/build.log" 2>&1; then
    grep -E "error" -A3 "$OUT/build.log" | head -40
    summary+=("release build FAILED")
    return 1
  fi
  echo "release build: $(( $(date +%s) - start )) s"
  (cd "$BUILD" && ctest --output-on-failure -j 8 --timeout 900) > "$OUT/ctest.log" 2>&1
  local rc=$?
  grep -E "\*\*\*Failed|\(Failed\)|tests passed|tests failed" "$OUT/ctest.log" | tail -25
  summary+=("ctest rc=$rc: $(grep -E 'tests passed' "$OUT/ctest.log" | tail -1), $(grep -c '(Skipped)' "$OUT/ctest.log") skipped")
  "$BUILD/bin/kiln" info --memory >> "$OUT/info.txt" 2>&1
  "$BUILD/bin/kiln" demo >> "$OUT/info.txt" 2>&1
  tail -25 "$OUT/info.txt"
  if [ "${KILN_PERF:-0}" = 1 ]; then
    for t in "$BUILD"/tests/kiln_cuda*_tests; do
      case "$t" in *large*) continue ;; esac
      KILN_CONFORMANCE_PERF=1 "$t" 2>&1 | grep '^\[perf\]'
    done > "$OUT/perf.log"
    summary+=("perf: $(wc -l < "$OUT/perf.log") cases timed")
  fi
  return $rc
}

sanitizer() {
  if ! command -v compute-sanitizer > /dev/null; then summary+=("compute-sanitizer: not installed"); return 0; fi
  if ! { cmake -G Ninja -S . -B "$DBG" -DCMAKE_BUILD_TYPE=Debug -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF &&
         cmake --build "$DBG" -j 16; } > "$OUT/build-debug.log" 2>&1; then
    grep -E "error" -A3 "$OUT/build-debug.log" | head -20
    summary+=("debug build FAILED")
    return 1
  fi
  local failing=0 clean=0
  : > "$OUT/sanitizer.log"
  for t in "$DBG"/tests/kiln_cuda*_tests; do
    # The >2^31-element tests move ~13 GB: far too slow under memcheck, and their kernels run here anyway.
    case "$t" in *large*) continue ;; esac
    # API errors are expected where tests provoke them (out of memory, a sync inside a capture); memory
    # errors (out-of-bounds, misaligned, uninitialised device reads) are what this run looks for.
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$t" >> "$OUT/sanitizer.log" 2>&1
    local r=$?
    if [ $r -eq 0 ]; then clean=$((clean + 1)); else failing=$((failing + 1)); echo "sanitizer: $(basename "$t") rc=$r"; fi
  done
  summary+=("compute-sanitizer memcheck: $clean executables clean, $failing failing")
  [ $failing -eq 0 ]
}

rc=0
case "$MODE" in
  release) release || rc=1 ;;
  sanitizer) sanitizer || rc=1 ;;
  *) release || rc=1; sanitizer || rc=1 ;;
esac
echo "SUMMARY: ${summary[*]}"
exit $rc
