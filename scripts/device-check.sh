#!/usr/bin/env bash
# On the GPU machine, in one go: the whole test suite (scripts/device-test.sh release) and then the
# operators side by side with PyTorch (scripts/device-bench.sh). Writes to $OUT: ctest.log and
# test-info.txt from the suite; kiln_ops.json, torch_ops.json, ops_table.md and bench.log from the benchmark.
#
#   scripts/device-check.sh [--filter REGEX] [--repeats N] [--no-tests]
#                           [--smoke EXE[:GTEST_FILTER]]... [--ncu "CASE_REGEX@KERNEL_REGEX[@ENV=V]"]...
#                           [--ncu-torch "CASE_REGEX@KERNEL_REGEX"]...
#
# --smoke runs a test executable of the release build (e.g. kiln_cuda_moe_tests:'*GroupedMm*') under a
# limit of SMOKE_TIMEOUT seconds (default 60) before anything else: a new kernel that hangs or fails there
# costs a minute, not the whole run.
#
# --ncu profiles one launch of the kernels matching KERNEL_REGEX while `kiln bench ops --filter CASE_REGEX`
# runs (optionally under one environment setting), after the benchmark: Nsight Compute's speed-of-light,
# memory, occupancy, scheduler and warp-state sections go to the end of bench.log (clocks not locked).
# NCU_STALLS=1 adds each stall reason's average warps per issued instruction and the tensor pipe's
# utilisation (ncu --metrics with regex: names; where a name does not exist on the device ncu reports it).
# --ncu-torch does the same for PyTorch's side of the case (bench/torch_ops.py), e.g. 'grouped_mm/bf16/T4096/E128/down@device_kernel'
# for its CUTLASS grouped kernel, so both sides' profiles sit in one log.
# NCU_METRICS=a,b,... adds those metrics (e.g. sm__cycles_active.min,sm__cycles_active.max: how evenly the
# multiprocessors were kept busy).
#
# e.g. scripts/device-check.sh --filter 'decode_attention|grouped_mm|^moe/' --repeats 30 \
#        --ncu 'grouped_mm/bf16/T4096/E128_.*/down@gmm_tma'
# Two builds or settings of kiln against each other on one card: scripts/ab-binaries.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
bench_args=()
smokes=()
ncus=()
ncus_torch=()
TESTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --filter|--repeats) bench_args+=("$1" "$2"); shift 2 ;;
    --smoke) smokes+=("$2"); shift 2 ;;     # may repeat
    --ncu) ncus+=("$2"); shift 2 ;;         # may repeat
    --ncu-torch) ncus_torch+=("$2"); shift 2 ;;  # may repeat
    --no-tests) TESTS=0; shift ;;
    -h|--help) sed -n 2,26p "$0"; exit 0 ;;
    *) echo "device-check.sh: unknown argument $1 (see --help)"; exit 1 ;;
  esac
done
W=$(mktemp -d)
rc=0
if [ ${#smokes[@]} -gt 0 ]; then
  t=$(date +%s)
  if ! { cmake -G Ninja -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF \
           $(scripts/device-cmake-args.sh) && cmake --build build-gpu -j 16; } > "$W/smoke-build.log" 2>&1; then
    grep -E "error" -A3 "$W/smoke-build.log" | head -40
    echo "== smoke: build FAILED"
    exit 1
  fi
  for s in "${smokes[@]}"; do
    exe=${s%%:*}; filter=${s#*:}; [ "$filter" = "$s" ] && filter='*'
    timeout "${SMOKE_TIMEOUT:-60}" "build-gpu/tests/$exe" --gtest_filter="$filter" > "$W/smoke.log" 2>&1
    r=$?
    echo "== smoke $s: rc=$r ($(grep -E '^\[  (PASSED|FAILED) ' "$W/smoke.log" | tr '\n' ' '))"
    if [ $r -ne 0 ]; then
      grep -E "Failure|FAILED" -A4 "$W/smoke.log" | head -30
      rc=1
    fi
  done
  echo "== smoke: $(( $(date +%s) - t )) s"
fi
if [ "$TESTS" = 1 ]; then
  t=$(date +%s)
  OUT=$W/test TEST_TIMEOUT=${TEST_TIMEOUT:-200} scripts/device-test.sh release > "$W/test.log" 2>&1 || rc=1
  grep -E "^== |SUMMARY|build" "$W/test.log"
  cp "$W/test/ctest.log" "$OUT/ctest.log" 2>/dev/null
  cp "$W/test/info.txt" "$OUT/test-info.txt" 2>/dev/null
  echo "== tests: rc=$rc, $(( $(date +%s) - t )) s"
fi
t=$(date +%s)
OUT=$W/bench scripts/device-bench.sh "${bench_args[@]}" > "$OUT/bench.log" 2>&1 || rc=1
for f in kiln_ops.json torch_ops.json ops_table.md; do
  [ -f "$W/bench/$f" ] && cp "$W/bench/$f" "$OUT/$f"
done
grep -E "^== |SUMMARY" "$OUT/bench.log"
echo "== bench: $(( $(date +%s) - t )) s"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
# One profile: side (kiln or torch), then "CASE_REGEX@KERNEL_REGEX[@ENV=V]".
profile() {
  local side=$1 n=$2 t case_re rest kern_re envs metrics
  t=$(date +%s)
  case_re=${n%%@*}; rest=${n#*@}; kern_re=${rest%%@*}; envs=""
  [ "$rest" != "$kern_re" ] && envs=${rest#*@}
  local cmd=(build-gpu/bin/kiln bench ops --filter "$case_re" --repeats 3)
  [ "$side" = torch ] && cmd=(python3 bench/torch_ops.py --filter "$case_re" --repeats 3)
  {
    echo "== ncu ($side): case '$case_re', kernel '$kern_re' ${envs:+with $envs}"
    metrics=""
    [ "${NCU_STALLS:-0}" = 1 ] && metrics='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^sm__pipe_tensor_op_.*cycles_active\.avg\.pct_of_peak_sustained_active$'
    [ -n "${NCU_METRICS:-}" ] && metrics=${metrics:+$metrics,}$NCU_METRICS
    local extra=()
    [ -n "$metrics" ] && extra=(--metrics "$metrics")  # ncu takes one --metrics
    timeout 180 env $envs "$NCU" --clock-control none -k "regex:$kern_re" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section LaunchStats "${extra[@]}" "${cmd[@]}" 2>&1 | grep -v "^==PROF==" | tail -220
  } >> "$OUT/bench.log"
  echo "== ncu ($side) '$case_re' '$kern_re' ${envs}: $(( $(date +%s) - t )) s"
}
for n in "${ncus[@]}"; do profile kiln "$n"; done
for n in "${ncus_torch[@]}"; do profile torch "$n"; done
exit $rc
