#!/usr/bin/env bash
# On the GPU machine: build kiln (Release, CUDA, the `kiln` command only), run `kiln bench ops` and the same
# cases through PyTorch (bench/torch_ops.py) in one run, and print the side-by-side table. Everything lands
# in $OUT: info.txt build.log kiln_ops.{json,log} torch_ops.{json,log} ops_table.{md,png}, and with --e2e
# e2e_kiln_*.json e2e_torch_*.json e2e.{md,log}.
#
#   scripts/device-bench.sh [--filter REGEX] [--repeats N] [--e2e PRESETS [--contexts LENGTHS]] [--no-ops]
#     --filter   passed to both sides (e.g. '^linear/' or 'softmax|rms_norm')
#     --repeats  timed batches / graph replays per case (default 100; a full run then takes ~2 min after the
#                build, each side printing per-section times as it goes)
#     --e2e P    also the engine: `kiln bench --preset`, bench/torch_e2e.py (transformers) and bench/gpt_fast.py
#                (gpt-fast-style torch.compile, the strongest PyTorch peer at batch 1) for each preset in the
#                comma-separated list P (e.g. qwen3-8b,qwen3-30b-a3b), decode rates side by side
#     --contexts L  with --e2e: also kiln's decode after prompts of each length in the comma-separated list L
#                (e.g. 2048,8192), to see how decode slows as the context grows
#     --quant Q  with --e2e: also kiln with its linear layers quantised, for each format in the comma-separated
#                list Q (q8_0, q4_0, q4_k), each a row beside the preset's own
#     --no-ops   skip the operator benchmark (with --e2e: only the engine)
#     --vae P    also `kiln bench vae --preset P` (f32 and bf16) and bench/torch_vae.py, same run (vae_*.json)
#   OPS_TIMEOUT=S  seconds each `kiln bench ops` run may take (default 400; a hang shows as rc=124)
#   GPT_FAST=0     with --e2e: leave out bench/gpt_fast.py (its compilation takes 1-2 minutes a preset)
#
# To compare two builds or two settings of kiln on one card, use scripts/ab-binaries.sh. To keep the results,
# copy the JSON files into a result set, bench/results/<gpu>-<date>/, and run scripts/plots.py
# (docs/benchmarks.md, "Adding a result set").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=build-gpu
FILTER=""
REPEATS=100
E2E=""
CONTEXTS=""
QUANT=""
OPS=1
VAE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --filter) FILTER=$2; shift 2 ;;
    --filter=*) FILTER=${1#--filter=}; shift ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --repeats=*) REPEATS=${1#--repeats=}; shift ;;
    --e2e) E2E=$2; shift 2 ;;
    --contexts) CONTEXTS=$2; shift 2 ;;
    --quant) QUANT=$2; shift 2 ;;
    --no-ops) OPS=0; shift ;;
    --vae) VAE=$2; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
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
if ! { cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF $(scripts/device-cmake-args.sh) &&
       cmake --build "$BUILD" -j 16 --target kiln_cli; } > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -40
  echo "SUMMARY: build FAILED"
  exit 1
fi
echo "== build: $(( $(date +%s) - t )) s"

kiln_rc=0; torch_rc=0
if [ "$OPS" = 1 ]; then
t=$(date +%s)
echo "== kiln bench ops ${args[*]}"
timeout "${OPS_TIMEOUT:-400}" "$BUILD/bin/kiln" bench ops --json "$OUT/kiln_ops.json" "${args[@]}" 2>&1 | tee "$OUT/kiln_ops.log"
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
fi

# ---- the engine: kiln and transformers on the same presets (random weights at real shapes)
e2e_rc=0
if [ -n "$E2E" ]; then
  echo "| preset | kiln pp512 t/s | kiln tg128 t/s | kiln GB/s (weights/token x tg) | transformers tg128 t/s | speedup | compiled PyTorch pp512 / tg128 t/s | speedup |" > "$OUT/e2e.md"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" >> "$OUT/e2e.md"
  for p in ${E2E//,/ }; do
    t=$(date +%s)
    timeout 240 "$BUILD/bin/kiln" bench --preset "$p" -p 512 -n 128 -r 3 --device cuda --json "$OUT/e2e_kiln_$p.json" \
      >> "$OUT/e2e.log" 2>&1 || e2e_rc=1
    base=${p%-fp8}
    if [ ! -s "$OUT/e2e_torch_$base.json" ]; then
      # MoE presets: transformers' grouped_mm experts path (its fastest; the default loops over experts).
      experts=(); case "$base" in *a3b*) experts=(--experts grouped_mm) ;; esac
      timeout 300 python3 bench/torch_e2e.py --preset "$base" -p 512 -n 128 -r 2 "${experts[@]}" \
        --json "$OUT/e2e_torch_$base.json" >> "$OUT/e2e.log" 2>&1 || e2e_rc=1
    fi
    if [ ! -s "$OUT/e2e_gptfast_$base.json" ] && [ "${GPT_FAST:-1}" = 1 ]; then
      timeout 420 python3 bench/gpt_fast.py --preset "$base" -p 512 -n 128 -r 3 --json "$OUT/e2e_gptfast_$base.json"         >> "$OUT/e2e.log" 2>&1 || e2e_rc=1
    fi
    python3 - "$p" "$OUT/e2e_kiln_$p.json" "$OUT/e2e_torch_$base.json" "$OUT/e2e_gptfast_$base.json" >> "$OUT/e2e.md" <<'PY'
import json, sys
p, kj, tj, gj = sys.argv[1:]
def load(f):
    try:
        return json.load(open(f))
    except Exception:
        return {}
k, t, g = load(kj), load(tj), load(gj)
kt, tt, gt = k.get("tg_mean"), t.get("tg_median"), g.get("tg_median")
sp = lambda o: f"{kt / o:.2f}x" if kt and o else "-"
f = lambda v, s=".1f": format(v, s) if v else "-"
print(f"| {p} | {f(k.get('pp_mean'))} | {f(kt)} | {f(k.get('decode_gbps'), '.0f')} | {f(tt, '.2f')} | {sp(tt)} | "
      f"{f(g.get('pp_median'))} / {f(gt, '.2f')} | {sp(gt)} |")
PY
    for q in ${QUANT//,/ }; do
      timeout 300 "$BUILD/bin/kiln" bench --preset "$p" --quant "$q" -p 512 -n 128 -r 3 --device cuda \
        --json "$OUT/e2e_kiln_${p}_$q.json" >> "$OUT/e2e.log" 2>&1 || e2e_rc=1
      python3 -c "import json, sys; k = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2])); print(f'| {sys.argv[3]} ({sys.argv[4]}) | {k[\"pp_mean\"]:.1f} ({k[\"pp_mean\"] / b[\"pp_mean\"]:.2f}x) | {k[\"tg_mean\"]:.1f} ({k[\"tg_mean\"] / b[\"tg_mean\"]:.2f}x) | {k[\"decode_gbps\"]:.0f} | - | - | - | - |')" \
        "$OUT/e2e_kiln_${p}_$q.json" "$OUT/e2e_kiln_$p.json" "$p" "$q" >> "$OUT/e2e.md" 2>> "$OUT/e2e.log" || e2e_rc=1
    done
    for c in ${CONTEXTS//,/ }; do
      timeout 240 "$BUILD/bin/kiln" bench --preset "$p" -p "$c" -n 128 -r 2 --device cuda --json "$OUT/e2e_kiln_$p-p$c.json" \
        >> "$OUT/e2e.log" 2>&1 || e2e_rc=1
      python3 -c "import json, sys; k = json.load(open(sys.argv[1])); print(f'| {sys.argv[2]} (prompt {sys.argv[3]}) | {k[\"pp_mean\"]:.1f} | {k[\"tg_mean\"]:.1f} | {k[\"decode_gbps\"]:.0f} | - | - | - | - |')" \
        "$OUT/e2e_kiln_$p-p$c.json" "$p" "$c" >> "$OUT/e2e.md" 2>> "$OUT/e2e.log" || e2e_rc=1
    done
    echo "== e2e $p: $(( $(date +%s) - t )) s"
  done
  cat "$OUT/e2e.md"
  echo "SUMMARY: e2e rc=$e2e_rc, total $(( $(date +%s) - t_all )) s"
fi
# ---- the video-VAE decoder: kiln (frames/s, the three memory peaks, PSNR against the CPU) and PyTorch
vae_rc=0
if [ -n "$VAE" ]; then
  for dt in f32 bf16; do
    timeout 300 "$BUILD/bin/kiln" bench vae --preset "$VAE" --device cuda --dtype "$dt" --json "$OUT/vae_kiln_$dt.json" \
      2>&1 | tee -a "$OUT/vae.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || vae_rc=1
    timeout 300 python3 bench/torch_vae.py --preset "$VAE" --device cuda --dtype "$dt" --json "$OUT/vae_torch_$dt.json" \
      2>&1 | tee -a "$OUT/vae.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || vae_rc=1
  done
  echo "SUMMARY: vae rc=$vae_rc"
fi
[ "$kiln_rc" -eq 0 ] && [ "$torch_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ] && [ "$vae_rc" -eq 0 ]
