#!/usr/bin/env bash
# On the GPU machine, in one call: the whole test suite (scripts/device-test.sh release) and then the
# operators side by side with PyTorch (scripts/device-bench.sh), optionally with an A/B run of kiln under
# other environment settings. What comes back fits the device tool's eight files: ctest.log and
# test-info.txt from the suite; kiln_ops.json, kiln_ops_ab.json, torch_ops.json, ops_table.md,
# ops_table_ab.md and bench.log from the benchmark.
#
#   scripts/device-check.sh [--filter REGEX] [--repeats N] [--ab "VAR=VALUE ..."]... [--no-tests]
#
# e.g. scripts/device-check.sh --filter 'decode_attention|grouped_mm|^moe/' --repeats 30 \
#        --ab "KILN_DECODE_TUNING=kernel=tma KILN_GROUPED_MM_PATH=tiled-wide"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
bench_args=()
TESTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --filter|--repeats|--ab) bench_args+=("$1" "$2"); shift 2 ;;  # --ab may repeat
    --no-tests) TESTS=0; shift ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "device-check.sh: unknown argument $1 (see --help)"; exit 1 ;;
  esac
done
W=$(mktemp -d)
rc=0
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
for f in kiln_ops.json kiln_ops_ab.json torch_ops.json ops_table.md ops_table_ab.md; do
  [ -f "$W/bench/$f" ] && cp "$W/bench/$f" "$OUT/$f"
done
grep -E "^== |SUMMARY" "$OUT/bench.log"
[ -f "$OUT/ops_table_ab.md" ] && awk 'NF == 0 { n++ } n < 2' "$OUT/ops_table_ab.md"  # the family geomeans
echo "== bench: $(( $(date +%s) - t )) s"
exit $rc
