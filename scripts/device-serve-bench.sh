#!/usr/bin/env bash
# On the GPU machine, after a Release build in build-gpu (scripts/device-test.sh): `kiln serve --preset P` on
# loopback, loaded by `kiln bench serve` at each concurrency level (prompt 512, output 128 by default), then
# `kiln bench` (batch 1) on the same preset for the single-stream reference. Results in $OUT:
# serve_P.json / serve_P.log (the load generator), e2e_kiln_P.json (batch 1), server_P.log, and transformers'
# batched generate at each level (bench/torch_e2e.py --batch B: e2e_torch_P_bB.json).
#
#   scripts/device-serve-bench.sh [PRESET] [CONCURRENCY]     defaults: qwen3-8b 1,8,32
#   PROMPT=N OUTPUT=N CTX=N (1024)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
K=build-gpu/bin/kiln
P=${1:-qwen3-8b}
C=${2:-1,8,32}
PROMPT=${PROMPT:-512}
OUTPUT=${OUTPUT:-128}
MAXB=$(tr ',' '\n' <<< "$C" | sort -n | tail -1)
PORT=18080
"$K" serve --preset "$P" --device cuda --port $PORT --max-batch "$MAXB" --ctx "${CTX:-1024}" > "$OUT/server_$P.log" 2>&1 &
SRV=$!
for _ in $(seq 240); do
  grep -q "listening on" "$OUT/server_$P.log" && break
  kill -0 $SRV 2> /dev/null || break
  sleep 0.5
done
timeout 300 "$K" bench serve --url http://127.0.0.1:$PORT --concurrency "$C" -p "$PROMPT" -n "$OUTPUT" \
  --json "$OUT/serve_$P.json" 2>&1 | tee "$OUT/serve_$P.log"
curl -s http://127.0.0.1:$PORT/metrics | grep -E "^kiln_(batch|kv|memory|decode|prefill)" >> "$OUT/serve_$P.log"
kill -TERM $SRV
wait $SRV
echo "server exit: $?" >> "$OUT/server_$P.log"
timeout 240 "$K" bench --preset "$P" -p "$PROMPT" -n "$OUTPUT" -r 3 --device cuda --json "$OUT/e2e_kiln_$P.json" 2>&1 |
  tail -5 | tee -a "$OUT/serve_$P.log"
# transformers' batched generate at the same concurrency levels (TORCH=0 skips it).
if [ "${TORCH:-1}" = 1 ]; then
  for b in $(tr ',' ' ' <<< "$C"); do
    timeout 200 python3 bench/torch_e2e.py --preset "$P" -p "$PROMPT" -n "$OUTPUT" -r 1 --batch "$b" \
      --json "$OUT/e2e_torch_${P}_b$b.json" 2>&1 | tail -1 | tee -a "$OUT/serve_$P.log"
  done
fi
