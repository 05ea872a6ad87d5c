#!/usr/bin/env bash
# On the GPU machine: build (Release, -lineinfo) and run the whole test suite, and the CUDA tests under
# compute-sanitizer (see sanitizer() below). Logs go to $OUT (at most 8 files come back from the device
# machine); a summary line comes last.
#
#   scripts/device-test.sh release      the build and the whole suite
#   scripts/device-test.sh sanitizer    memcheck over every CUDA test executable
#   scripts/device-test.sh sync         racecheck and synccheck over the kernels with shared memory or barriers
#   scripts/device-test.sh all          release, then sanitizer (the default)
#   KILN_PERF=1     also time every CUDA conformance case (perf.log)
#   TESTS=REGEX     only the test executables whose names match
#   TEST_TIMEOUT=S  seconds each executable may take (default 240)
#   SAN_EXES=REGEX  sanitizer modes: only the test executables whose names match
#   SAN_DEADLINE=S  sanitizer modes: seconds for all of it (default 480); SAN_JOBS=N processes at once (8)
#   SAN_SHARDS=N    sanitizer modes: each executable's tests split over N processes (GoogleTest shards)
#   SAN_FILTER=F    sanitizer modes: only the tests of the CUDA executables that the GoogleTest filter F takes
#   PREBUILT=1      use the test executables already in build-gpu/tests (built elsewhere with the same
#                   configuration and carried here) instead of building
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
MODE=${1:-all}
BUILD=build-gpu
summary=()

# The Release build both modes use (once per call).
BUILT=0
build_release() {
  [ "$BUILT" = 1 ] && return 0
  if [ "${PREBUILT:-0}" = 1 ] && ls "$BUILD"/tests/kiln_*_tests > /dev/null 2>&1; then
    BUILT=1
    echo "release build: the executables carried in $BUILD/tests (PREBUILT=1)"
    return 0
  fi
  local start=$(date +%s)
  # The Python module and its tests too where python3 has nanobind, NumPy and pytest (the GPU machine's
  # image does), so that the DLPack and torch tests run against CUDA and PyTorch there.
  local py=()
  if python3 -c "import nanobind, numpy, pytest" 2> /dev/null; then
    py=(-DKILN_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)")
  fi
  if ! { cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF "${py[@]}" $(scripts/device-cmake-args.sh) &&
         cmake --build "$BUILD" -j 16; } > "$OUT/build.log" 2>&1; then
    grep -E "error" -A3 "$OUT/build.log" | head -40
    summary+=("release build FAILED")
    return 1
  fi
  BUILT=1
  echo "release build: $(( $(date +%s) - start )) s"
}

release() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    nvcc --version | tail -1
  } > "$OUT/info.txt" 2>&1
  cat "$OUT/info.txt"
  build_release || return 1
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
  # outnumber the cores spin against each other and slow every suite down).
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
  (cd "$BUILD" && ctest --output-on-failure -R "^(cli_|KilnBench|Docs|Package|python)" --timeout 600) >> "$OUT/ctest.log" 2>&1 ||
    failed+=("ctest: command-line, package and Python tests")
  # Concurrency: six processes of the CUDA golden-model tests at once, four rounds each. GPU time-slicing
  # delays copies and kernels, which exposes missing stream ordering (e.g. a model stream reading weights
  # whose uploads, on the caller's stream, have not landed).
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

# compute-sanitizer over the Release build (built with -lineinfo by scripts/device-cmake-args.sh, so
# reports name source lines), SAN_JOBS test executables at a time. sanitizer() takes the tools: memcheck
# runs over every CUDA test executable and the CUDA cases of the others; racecheck (shared-memory hazards)
# and synccheck (block, warp and cluster barriers) over the executables whose kernels use shared memory
# or barriers. One log per tool and executable in sanitizer.tgz; sanitizer.log holds one line each and
# the reports of the failing ones.
#   SAN_TOOLS="..."     the tools to run (the mode's by default: memcheck, or racecheck and synccheck)
#   SAN_JOBS=N          executables under a tool at once (default 8)
#   SAN_TIMEOUT=S       seconds each may take (default 420)
#   SAN_SHARDS=N        each executable's tests split over N processes (GTEST_TOTAL_SHARDS; default 1):
#                       racecheck and synccheck run kernels 10-100x slower, so a long executable finishes
#                       in time only when its tests run side by side
#   SAN_DEADLINE=S      seconds for the whole pass (default 480, so that the build and the pass fit one
#                       10-minute call); runs still going then are stopped and reported as timed out
#   RACECHECK_SKIP=A:B  GoogleTest names racecheck leaves out (default: the two that run cuBLASLt; see below)
sanitizer() {
  if ! command -v compute-sanitizer > /dev/null; then summary+=("compute-sanitizer: not installed"); return 0; fi
  build_release || return 1
  local dir="$OUT/sanitizer" t0=$(date +%s)
  mkdir -p "$dir"
  : > "$OUT/sanitizer.log"
  compute-sanitizer --version | tail -1 >> "$OUT/sanitizer.log"
  # The >2^31-element tests move ~13 GB: far too slow under a sanitizer, and their kernels run in the suite.
  local exes=($(ls -Sr "$BUILD"/tests/kiln_cuda*_tests | grep -v large))
  local mixed=(kiln_core_tests kiln_creation_tests kiln_io_tests kiln_llm_tests kiln_nn_tests kiln_linalg_tests)
  # Of those, the ones whose CUDA tests run kernels with shared memory and warp barriers (linalg's small-matrix
  # kernels): under every tool.
  local mixed_shared=(kiln_linalg_tests)
  # The kernels with shared memory, warp or block barriers, or cluster barriers (softmax, sampling, norms,
  # reductions, attention, the grouped and one-row products, FP8).
  # matmul is not among them: its tests run cuBLAS only (no kiln kernel).
  local shared=(softmax sampling norm reduce attention moe linear fp8 index)
  # Jobs from the smallest executable up (size is a rough proxy for run time), each under every tool
  # before the next: within the deadline as many executables as possible finish, and what does not start
  # or finish in time is reported as such.
  # A job is tool:executable:shard:gtest filter; its log is $dir/tool-executable[.shard].log.
  local jobs=() tools=(${SAN_TOOLS:-$1}) shards=${SAN_SHARDS:-1}
  add_job() {
    local i
    for ((i = 0; i < shards; i++)); do jobs+=("$1:$2:$i:$3"); done
  }
  for x in "${exes[@]}"; do
    local name=$(basename "$x") fam
    [[ "$name" =~ ${SAN_EXES:-.} ]] || continue
    fam=${name#kiln_cuda_}; fam=${fam%_tests}
    for tool in "${tools[@]}"; do
      if [ "$tool" = memcheck ] || [[ " ${shared[*]} " == *" $fam "* ]]; then add_job "$tool" "$name" "${SAN_FILTER:-*}"; fi
    done
  done
  # A mixed executable's CUDA tests: suites named *Cuda*, or parameterised cases named *_cuda.
  for m in "${mixed[@]}"; do
    [ -x "$BUILD/tests/$m" ] && [[ "$m" =~ ${SAN_EXES:-.} ]] || continue
    for tool in "${tools[@]}"; do
      if [ "$tool" = memcheck ] || [[ " ${mixed_shared[*]} " == *" $m "* ]]; then add_job "$tool" "$m" "*Cuda*:*_cuda"; fi
    done
  done
  log_of() {  # tool exe shard
    if [ "$shards" -gt 1 ]; then echo "$dir/$1-$2.$3.log"; else echo "$dir/$1-$2.log"; fi
  }
  # The CPU references of the tests run in SAN_JOBS processes at once: a few OpenMP threads each, not all
  # cores each (threads that outnumber the cores spin against each other).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
  # The statistical tests draw a few batches under a sanitizer (tests/test_util.h, under_gpu_sanitizer).
  export KILN_UNDER_SANITIZER=1
  local deadline=$(( t0 + ${SAN_DEADLINE:-480} ))
  for j in "${jobs[@]}"; do
    local tool=${j%%:*} rest=${j#*:}
    local exe=${rest%%:*}; rest=${rest#*:}
    local shard=${rest%%:*} filter=${rest#*:}
    local left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 20 ]; then echo "not run: SAN_DEADLINE reached" > "$(log_of "$tool" "$exe" "$shard")"; continue; fi
    (
      local log=$(log_of "$tool" "$exe" "$shard") s=$(date +%s) extra=() limit=${SAN_TIMEOUT:-420}
      [ "$limit" -gt "$left" ] && limit=$left
      # API errors are expected where tests provoke them (out of memory, a sync inside a capture); the
      # tools look for memory errors, shared-memory races and barrier misuse.
      [ "$tool" = memcheck ] && extra=(--report-api-errors no)
      # racecheck instruments kiln's kernels only (their names hold kiln's namespace): cuBLAS's Hopper kernels
      # synchronise their shared memory through the asynchronous proxy (TMA, mbarriers), which racecheck does
      # not model (it reported write-after-read hazards in every nvjet_* kernel). On an H100 the tests that run
      # cuBLASLt products (CudaLinear.DefaultPathMatchesCpu, CudaMoeForward.GraphCaptureAndReplay) stop with
      # "Internal Sanitizer Error: failed to handle a hardware exception" whichever kiln kernels racecheck
      # instruments (scripts/device-racecheck-bisect.sh: the same with only the fill kernels, or only gemv),
      # also with KILN_PDL=0, while a gemv-only test passes and memcheck finds nothing: the fault follows the
      # library's kernels running under racecheck, not a kiln kernel.
      # Those tests (RACECHECK_SKIP, GoogleTest names) run under synccheck and memcheck only.
      if [ "$tool" = racecheck ]; then
        extra=(--racecheck-report hazard --kernel-name kns=kiln)
        filter="$filter-${RACECHECK_SKIP:-CudaLinear.DefaultPathMatchesCpu:CudaMoeForward.GraphCaptureAndReplay}"
      fi
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
        timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
        --print-limit 50 "$BUILD/tests/$exe" --gtest_filter="$filter" > "$log" 2>&1
      echo "exit $? after $(( $(date +%s) - s )) s" >> "$log"
    ) &
    while [ "$(jobs -r | wc -l)" -ge "${SAN_JOBS:-8}" ]; do sleep 0.5; done
  done
  wait
  local failing=0 clean=0 unfinished=0
  for j in "${jobs[@]}"; do
    local tool=${j%%:*} rest=${j#*:}
    local exe=${rest%%:*}; rest=${rest#*:}
    local shard=${rest%%:*}
    local log=$(log_of "$tool" "$exe" "$shard")
    [ "$shards" -gt 1 ] && exe="$exe (shard $((shard + 1))/$shards)"
    # Out of time: the errors reported before the stop still count.
    if tail -1 "$log" | grep -qE "^not run|^exit 124 " && ! grep -qE "^========= (Invalid|Barrier|Race|Error)" "$log"; then
      unfinished=$((unfinished + 1))
      echo "$tool $exe: $(tail -1 "$log"); $(grep -cE '^\[       OK' "$log") tests passed before the stop" >> "$OUT/sanitizer.log"
      continue
    fi
    local tests=$(grep -E '^\[  (PASSED|FAILED) ' "$log" | tr -s ' ' | tr '\n' ' ')
    local errs=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
    echo "$tool $exe: $(tail -1 "$log"); $tests; ${errs:-no summary}" >> "$OUT/sanitizer.log"
    if tail -1 "$log" | grep -q "^exit 0 "; then
      clean=$((clean + 1))
    else
      failing=$((failing + 1))
      echo "sanitizer: $tool $exe: $(tail -1 "$log")"
      { echo "---- $tool $exe"; grep -E "^=========|FAILED|Failure" "$log" | head -60; tail -15 "$log"; } >> "$OUT/sanitizer.log"
    fi
  done
  tar czf "$OUT/sanitizer.tgz" -C "$OUT" sanitizer && rm -rf "$dir"
  summary+=("compute-sanitizer (${tools[*]}): $clean runs clean, $failing failing, $unfinished out of time, $(( $(date +%s) - t0 )) s")
  [ $failing -eq 0 ]
}

# Stopped from outside (a time limit): stop the test processes too, so they do not hold the GPU.
trap 'pkill -f "$BUILD/tests/kiln_"; exit 143' TERM INT
rc=0
case "$MODE" in
  release) release || rc=1 ;;
  sanitizer) sanitizer memcheck || rc=1 ;;
  sync) sanitizer "racecheck synccheck" || rc=1 ;;
  all) release || rc=1; sanitizer memcheck || rc=1 ;;
  *) echo "device-test.sh: unknown mode $MODE (release, sanitizer, sync, all)"; exit 2 ;;
esac
echo "SUMMARY: ${summary[*]}"
exit $rc
