#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with AddressSanitizer and UBSan, build directory build-fuzz) and
# runs each for a bounded time from its corpus in fuzz/corpus/<target>.
#
#   scripts/fuzz.sh [--seconds N] [--merge] [--jobs J] [TARGET...]
#     --seconds N  how long each target runs (default 60)
#     --merge      afterwards, add the inputs that reached new code to fuzz/corpus/<target> (libFuzzer's
#                  -merge=1: only coverage-increasing inputs are kept); without it the corpus is read only
#     --jobs J     targets run at once (default: the number of cores)
#     TARGET       safetensors config tokenizer tokenizer_encode chat gguf request (default: all)
#
# A crash, a leak, a sanitizer report, a failed property (KILN_FUZZ_CHECK) or an input slower than
# FUZZ_TIMEOUT seconds (default 30) fails the run: the script prints the target's report and the
# reproducer (path and base64), and exits 1. Keep the reproducer as a unit test or in fuzz/corpus/<target>
# (the test suite replays the corpora: kiln_fuzz_replay_tests).
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=60
MERGE=0
JOBS=$(nproc)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --merge) MERGE=1; shift ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)"; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=(safetensors config tokenizer tokenizer_encode chat gguf request)
BUILD=${FUZZ_BUILD:-build-fuzz}
CXX_CLANG=${FUZZ_CXX:-$(command -v clang++ || true)}
if [ -z "$CXX_CLANG" ]; then
  echo "fuzz.sh: clang++ not found (libFuzzer needs clang): scripts/install-deps.sh --fuzz installs it"
  exit 2
fi

t0=$(date +%s)
if ! { [ -f "$BUILD/build.ninja" ] ||
       cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$CXX_CLANG" -DKILN_FUZZ=ON; } ||
   ! cmake --build "$BUILD" -j "$JOBS"; then
  echo "fuzz.sh: the fuzz build failed"
  exit 1
fi
echo "fuzz.sh: built in $(( $(date +%s) - t0 )) s; ${#targets[@]} targets x ${SECONDS_EACH} s, $JOBS at a time"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ARTIFACTS="$BUILD/artifacts"  # reproducers of failing inputs, kept after the run
mkdir -p "$ARTIFACTS"
run_one() {
  local name=$1 exe="$BUILD/fuzz/fuzz_$1" corpus="fuzz/corpus/$1"
  local new="$WORK/$name-new" art="$ARTIFACTS/$name" log="$WORK/$name.log"
  mkdir -p "$new" "$art" "$corpus"
  local dict=()
  [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
  # New inputs go to the first folder (a scratch one); the committed corpus is read only.
  "$exe" -max_total_time="$SECONDS_EACH" -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 \
    -artifact_prefix="$art/" -print_final_stats=1 "${dict[@]}" "$new" "$corpus" > "$log" 2>&1
  echo $? > "$WORK/$name.rc"
  if [ "$MERGE" = 1 ] && [ "$(cat "$WORK/$name.rc")" = 0 ]; then
    "$exe" -merge=1 "$corpus" "$new" >> "$log" 2>&1
  fi
}
pids=()
for name in "${targets[@]}"; do
  if [ ! -x "$BUILD/fuzz/fuzz_$name" ]; then echo "fuzz.sh: no target '$name'"; exit 2; fi
  run_one "$name" &
  pids+=($!)
  while [ "$(jobs -r | wc -l)" -ge "$JOBS" ]; do sleep 1; done
done
wait

failed=()
for name in "${targets[@]}"; do
  rc=$(cat "$WORK/$name.rc" 2>/dev/null || echo 1)
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$WORK/$name.log" | grep -oE '[0-9]+$')
  cov=$(grep -oE '(cov|ft): [0-9]+' "$WORK/$name.log" | tail -2 | tr '\n' ' ')
  echo "== $name: rc=$rc, ${runs:-?} inputs, $cov, corpus $(ls "fuzz/corpus/$name" | wc -l) files"
  if [ "$rc" != 0 ]; then
    failed+=("$name")
    echo "---- $name: libFuzzer's report"
    grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse|INITED|RELOAD)' "$WORK/$name.log" | tail -80
    for a in "$ARTIFACTS/$name"/*; do
      [ -f "$a" ] && [ "$a" -nt "$WORK" ] || continue
      echo "---- reproducer $a ($(stat -c %s "$a") bytes; replay: $BUILD/fuzz/fuzz_$name $a), base64:"
      base64 -w 120 "$a" | head -c 32768
      echo
    done
  fi
done
echo "fuzz.sh: $(( $(date +%s) - t0 )) s in all; failing: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
