#!/usr/bin/env bash
# On the GPU machine, after a Release build in build-gpu (scripts/device-test.sh): speculative decoding's
# figures. Results in $OUT:
#   spec_bench_P.json / .log   kiln bench --preset P: decode at prompts of 512 (and --contexts), the floor, and
#                              the verify step of 2, 3, 5 and 9 positions against one decode step
#   spec_equal_P.log           greedy output with --lookup equal to plain greedy output for 256 tokens
#   spec_tiny.log              the shipped model (when present) on a text followed by its beginning: decode rate
#                              plain and with prompt lookup at 4 and 8 drafts, and the outputs compared
#
#   scripts/device-spec-bench.sh [PRESET]     default qwen3-8b; CONTEXTS=8192,32768
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
K=build-gpu/bin/kiln
P=${1:-qwen3-8b}
timeout 300 "$K" bench --preset "$P" --device cuda -p 512 -n 128 -r 3 --verify 1,2,4,8 \
  --contexts "${CONTEXTS:-8192,32768}" --json "$OUT/spec_bench_$P.json" 2>&1 | tee "$OUT/spec_bench_$P.log"

# A prompt of 256 random ids followed by its first 64: lookup finds drafts there.
ids=$(python3 -c "import random; random.seed(1); a=[random.randrange(1000, 50000) for _ in range(256)]; print(','.join(map(str, a + a[:64])))")
{
  plain=$(timeout 120 "$K" generate --preset "$P" --device cuda --prompt-ids "$ids" -n 256 --temp 0 --ids --ignore-eos)
  for k in 4 8; do
    spec=$(timeout 120 "$K" generate --preset "$P" --device cuda --prompt-ids "$ids" -n 256 --temp 0 --ids --ignore-eos \
      --lookup 3 --num-draft $k)
    [ "$plain" = "$spec" ] && echo "lookup 3, $k drafts: 256 greedy tokens identical" ||
      echo "lookup 3, $k drafts: DIFFERENT from plain greedy"
  done
} 2>&1 | tee "$OUT/spec_equal_$P.log"

M=models/kiln-tiny
if [ -f "$M/model.safetensors" ]; then
  text=$(head -c 1200 "$M/heldout.txt")
  prompt="$text

${text:0:200}"
  {
    base=$("$K" generate -m "$M" --device cuda --temp 0 -n 256 --ignore-eos --ids -p "$prompt" 2> "$OUT/tiny_plain.err")
    grep generated "$OUT/tiny_plain.err" | sed 's/^/plain: /'
    for k in 4 8; do
      out=$("$K" generate -m "$M" --device cuda --temp 0 -n 256 --ignore-eos --ids -p "$prompt" --lookup 3 --num-draft $k \
        2> "$OUT/tiny_spec.err")
      grep -E "generated|speculative" "$OUT/tiny_spec.err" | sed "s/^/lookup 3, $k drafts: /"
      [ "$out" = "$base" ] && echo "lookup 3, $k drafts: identical to plain" || echo "lookup 3, $k drafts: DIFFERENT"
    done
    rm -f "$OUT/tiny_plain.err" "$OUT/tiny_spec.err"
  } 2>&1 | tee "$OUT/spec_tiny.log"
fi
