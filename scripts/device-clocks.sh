#!/usr/bin/env bash
# On the GPU machine: the SM clock, power, temperature and the active clock-event reasons (nvidia-smi, every
# 50 ms; the reasons as its bit mask, e.g. 0x4 software power cap, 0x8 hardware slowdown) while kiln and PyTorch
# run the same operator cases back to back, each side twice, so a gap between graph-replayed times and a
# single profiled launch can be told apart from clocks that drop under sustained load. Needs build-gpu/bin/kiln
# (scripts/device-bench.sh or device-check.sh builds it). Writes $OUT/clocks.csv (the samples),
# $OUT/clocks-bench.log (both sides' output with the wall time each phase started) and prints per phase the
# median SM clock and power of its samples.
#
#   scripts/device-clocks.sh CASE_REGEX [REPEATS]     (REPEATS: graph replays per case, default 300)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
CASES=${1:?case regex}
REPEATS=${2:-300}
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms 50 \
  > "$OUT/clocks.csv" &
sampler=$!
sleep 1
phases=()
for round in 1 2; do
  for side in kiln torch; do
    phases+=("$side$round $(date +%s.%N)")
    echo "== $side round $round" >> "$OUT/clocks-bench.log"
    if [ "$side" = kiln ]; then
      build-gpu/bin/kiln bench ops --filter "$CASES" --repeats "$REPEATS" >> "$OUT/clocks-bench.log" 2>&1
    else
      python3 bench/torch_ops.py --filter "$CASES" --repeats "$REPEATS" >> "$OUT/clocks-bench.log" 2>&1
    fi
  done
done
phases+=("end $(date +%s.%N)")
sleep 1
kill "$sampler"
printf '%s\n' "${phases[@]}" > "$OUT/clocks-phases.txt"
# Each phase: the samples between its start and the next phase's start (nvidia-smi's timestamps are local time).
python3 - "$OUT/clocks.csv" "$OUT/clocks-phases.txt" <<'EOF'
import collections, datetime, statistics, sys
samples = []
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(parts[1]), float(parts[2]), float(parts[3]), parts[4] if len(parts) > 4 else "?"))
    except (ValueError, IndexError):
        continue
phases = [(n, float(t)) for n, t in (l.split() for l in open(sys.argv[2]) if l.strip())]
for (name, t0), (_, t1) in zip(phases, phases[1:]):
    s = [x for x in samples if t0 <= x[0] < t1]
    if not s:
        print(f"{name}: no samples")
        continue
    busy = [x for x in s if x[2] > 200] or s  # samples under load (power above 200 W)
    print(f"{name}: {t1 - t0:.1f} s, {len(s)} samples, under load {len(busy)}: SM clock median "
          f"{statistics.median(x[1] for x in busy):.0f} MHz (min {min(x[1] for x in busy):.0f}), power median "
          f"{statistics.median(x[2] for x in busy):.0f} W (max {max(x[2] for x in busy):.0f}), temperature max "
          f"{max(x[3] for x in s):.0f} C, clock-event reasons under load "
          f"{dict(collections.Counter(x[4] for x in busy))}")
EOF
