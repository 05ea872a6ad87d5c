#!/usr/bin/env bash
# On the GPU machine: build and run the whole test suite, then the CUDA tests of a Debug build under
# compute-sanitizer memcheck. Logs go to $OUT (at most 8 files come back from the device machine); a
# summary line comes last.
#
#   scripts/device-test.sh [all|release|sanitizer]     (default: all)
#   KILN_PERF=1     also time every CUDA conformance case (perf.log)
#   TESTS=REGEX     only the test executables whose names match
#   TEST_TIMEOUT=S  seconds each executable may take (default 240)
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
  if ! { cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF $(scripts/device-cmake-args.sh) &&
         cmake --build "$BUILD" -j 16; } > "$OUT/build.log" 2>&1; then
    grep -E "error" -A3 "$OUT/build.log" | head -40
    summary+=("release build FAILED")
    return 1
  fi
  echo "release build: $(( $(date +%s) - start )) s"
  # Each test executable runs once, its cases in one process (ctest starts one process, and one CUDA
  # context, per case: several minutes more on the GPU machine), six at a time; then the non-gtest CTest
  # entries (command-line tests).
  local rc=0 failed=()
  local logs="$OUT/tests"
  mkdir -p "$logs"
  : > "$OUT/ctest.log"
  # The largest executables first (a rough proxy for the slowest); each gets TEST_TIMEOUT seconds (a hang shows as exit 124 in its log).
  local exes=($(ls -S "$BUILD"/tests/kiln_*_tests | grep -E "${TESTS:-.}"))
  # Six processes share the cores: each gets its sixth of them for its CPU references (OpenMP threads that
  # outnumber the cores spin against each other; the conformance suites took 190-250 s that way).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( ($(nproc) + 5) / 6 ))}
  for x in "${exes[@]}"; do
    local name=$(basename "$x")
    ( s=$(date +%s); timeout "${TEST_TIMEOUT:-240}" "$x" > "$logs/$name.log" 2>&1
      echo "exit $? after $(( $(date +%s) - s )) s" >> "$logs/$name.log" ) &
    while [ "$(jobs -r | wc -l)" -ge 6 ]; do sleep 0.5; done
  done
  wait
  for x in "${exes[@]}"; do
    local log="$logs/$(basename "$x").log"
    echo "== $(basename "$x"): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$log" | tr '\n' ' ') $(tail -1 "$log")" >> "$OUT/ctest.log"
    if ! tail -1 "$log" | grep -q "^exit 0 "; then failed+=("$(basename "$x")"); tail -60 "$log" >> "$OUT/ctest.log"; fi
  done
  tar czf "$OUT/test-logs.tgz" -C "$OUT" tests && rm -rf "$logs"
  (cd "$BUILD" && ctest --output-on-failure -R "^(cli_|KilnBench)" --timeout 300) >> "$OUT/ctest.log" 2>&1 || failed+=("ctest cli")
  # Concurrency: six processes of the CUDA golden-model tests at once, four rounds each. GPU time-slicing
  # delays copies and kernels, which exposes missing stream ordering (the model's stream once read weights
  # whose uploads, on the caller's stream, had not landed: every model failed this way).
  if [ -x "$BUILD/tests/kiln_llm_tests" ]; then
    local cdir="$OUT/concurrent"
    mkdir -p "$cdir"
    for i in 1 2 3 4 5 6; do
      timeout 120 "$BUILD/tests/kiln_llm_tests" --gtest_filter='*Golden.Cuda*' --gtest_repeat=4 > "$cdir/$i.log" 2>&1 &
    done
    wait
    local cfail=$(cat "$cdir"/*.log | grep -cE '^\[  FAILED  \] Models.*\(')
    local crun=$(cat "$cdir"/*.log | grep -cE '^\[       OK \] Models|^\[  FAILED  \] Models.*\(')
    echo "== concurrent golden tests (6 processes x 4 rounds): $cfail of $crun model runs failed" >> "$OUT/ctest.log"
    [ "$cfail" -eq 0 ] || { failed+=("concurrent golden tests"); grep -h -A3 "Failure" "$cdir"/*.log | head -20 >> "$OUT/ctest.log"; }
    rm -rf "$cdir"
  fi
  grep -E "^== " "$OUT/ctest.log"
  [ ${#failed[@]} -eq 0 ] || rc=1
  summary+=("tests rc=$rc, failing: ${failed[*]:-none}")
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
  if ! { cmake -G Ninja -S . -B "$DBG" -DCMAKE_BUILD_TYPE=Debug -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF $(scripts/device-cmake-args.sh) &&
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

# Stopped from outside (a time limit): stop the test processes too, so they do not hold the GPU.
trap 'pkill -f "$BUILD/tests/kiln_"; pkill -f "$DBG/tests/kiln_"; exit 143' TERM INT
rc=0
case "$MODE" in
  release) release || rc=1 ;;
  sanitizer) sanitizer || rc=1 ;;
  *) release || rc=1; sanitizer || rc=1 ;;
esac
echo "SUMMARY: ${summary[*]}"
exit $rc
