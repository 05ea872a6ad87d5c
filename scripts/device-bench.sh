#!/usr/bin/env bash
# On the GPU machine: build kiln (Release, CUDA, the `kiln` command only), run `kiln bench ops` and the same
# cases through PyTorch (bench/torch_ops.py) in one call, and print the side-by-side table. Everything lands
# in $OUT (8 files at most): info.txt build.log kiln_ops.{json,log} torch_ops.{json,log} ops_table.{md,png}.
#
#   scripts/device-bench.sh [--filter REGEX] [--repeats N]
#     --filter   passed to both sides (e.g. '^linear/' or 'softmax|rms_norm')
#     --repeats  timed batches / graph replays per case (default 100; a full run then takes ~2 min after the
#                build, each side printing per-section times as it goes)
#
# Copy $OUT/kiln_ops.json and torch_ops.json to bench/results/<gpu>-<date>-{kiln,torch}_ops.json and the
# table to docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=build-gpu
FILTER=""
REPEATS=100
while [ $# -gt 0 ]; do
  case "$1" in
    --filter) FILTER=$2; shift 2 ;;
    --filter=*) FILTER=${1#--filter=}; shift ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --repeats=*) REPEATS=${1#--repeats=}; shift ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "device-bench.sh: unknown argument $1 (see --help)"; exit 1 ;;
  esac
done
args=(--repeats "$REPEATS")
[ -n "$FILTER" ] && args+=(--filter "$FILTER")
t_all=$(date +%s)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm --format=csv
  nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} > "$OUT/info.txt" 2>&1
cat "$OUT/info.txt"

t=$(date +%s)
# The same configuration as scripts/device-test.sh, so both reuse build-gpu; only the `kiln` target is built.
if ! { cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF &&
       cmake --build "$BUILD" -j 16 --target kiln_cli; } > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -40
  echo "SUMMARY: build FAILED"
  exit 1
fi
echo "== build: $(( $(date +%s) - t )) s"

t=$(date +%s)
echo "== kiln bench ops ${args[*]}"
"$BUILD/bin/kiln" bench ops --json "$OUT/kiln_ops.json" "${args[@]}" 2>&1 | tee "$OUT/kiln_ops.log"
kiln_rc=${PIPESTATUS[0]}
echo "== kiln: rc=$kiln_rc, $(( $(date +%s) - t )) s"

t=$(date +%s)
echo "== bench/torch_ops.py ${args[*]}"
python3 bench/torch_ops.py --json "$OUT/torch_ops.json" "${args[@]}" 2>&1 | tee "$OUT/torch_ops.log"
torch_rc=${PIPESTATUS[0]}
echo "== PyTorch: rc=$torch_rc, $(( $(date +%s) - t )) s"

# A side that did not run still gets its column ("not run") so the other side's numbers are printed.
for side in kiln torch; do
  [ -s "$OUT/${side}_ops.json" ] || echo '{"cases": []}' > "$OUT/${side}_ops.json"
done
echo
python3 scripts/bench_table.py "$OUT/kiln_ops.json" "$OUT/torch_ops.json" --md "$OUT/ops_table.md" \
  --png "$OUT/ops_table.png"
echo
awk 'NF == 0 { n++ } n < 2' "$OUT/ops_table.md"  # the header and the summary again, after the long table
echo "SUMMARY: kiln rc=$kiln_rc, torch rc=$torch_rc, $(grep -c '"error"' "$OUT/kiln_ops.json") kiln error rows," \
  "$(grep -c '"error"' "$OUT/torch_ops.json") PyTorch error rows, total $(( $(date +%s) - t_all )) s"
[ "$kiln_rc" -eq 0 ] && [ "$torch_rc" -eq 0 ]
