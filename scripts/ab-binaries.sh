#!/usr/bin/env bash
# The same operators timed with several builds (or settings) of kiln on one GPU machine, interleaved: each
# round runs every build once, so a code change and the default are measured on the same card under the same
# conditions. Separate runs on different machines of one kind differ by several percent, more than many
# kernel changes gain, which is why this script exists. The builds are made here and carried, so no time on
# the GPU machine goes to compiling.
#
# Here:   scripts/ab-binaries.sh build NAME=REV[+PATCH...] [NAME=REV[+PATCH...] ...]
#   builds `kiln` (Release, CUDA, the `kiln` command only) at each git revision REV (commit, branch or tag;
#   commit work first, or pass it as a patch file: paths from the repository root, applied on top of REV)
#   in one scratch worktree ($AB_WORKTREE, default /tmp/kiln-ab-worktree) with one build folder, so each
#   build after the first recompiles only what differs; strips it and compresses it into
#   build-ab/kiln-NAME.xz (about 11 MB). PCRE2 and utf8proc link statically from .deps
#   (scripts/fetch-device-deps.sh), as for the device's own builds. The first NAME is the baseline.
# There:  scripts/ab-binaries.sh run [--filter REGEX] [--repeats N] [--rounds R] [--env "NAME:VAR=V ..."]...
#   (with build-ab carried to the GPU machine) unpacks build-ab/*.xz, checks that each build starts (on
#   failure: the libraries it cannot find), then runs `kiln bench ops` with every build in turn, R rounds
#   (default 2), and writes $OUT/ab_runs.json (every run's cases) and $OUT/ab_table.md (each case's
#   graph-replayed µs per build, the median over rounds, and each build's geomean time against the
#   baseline's, by op family). --env adds a variant NAME: the baseline build run with those environment
#   settings (e.g. --env "five:KILN_GEMV_MINB=5"), in turn with the builds in every round. With no build-ab
#   folder, `kiln` of build-gpu (scripts/device-bench.sh's build) is the baseline.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  build)
    [ $# -gt 0 ] || { echo "ab-binaries.sh build: give NAME=REV pairs"; exit 1; }
    wt=${AB_WORKTREE:-/tmp/kiln-ab-worktree}
    [ -d "$wt" ] || git worktree add -q --detach "$wt" HEAD || exit 1
    mkdir -p build-ab
    for spec in "$@"; do
      name=${spec%%=*}
      rev=${spec#*=}
      [ "$name" != "$spec" ] && [ -n "$name" ] || { echo "ab-binaries.sh: $spec is not NAME=REV[+PATCH...]"; exit 1; }
      patches=()
      if [[ $rev == *+* ]]; then IFS=+ read -r -a patches <<< "${rev#*+}"; rev=${rev%%+*}; fi
      # Resolved here, not in the worktree: there HEAD (or a relative rev) would name the worktree's checkout.
      rev=$(git rev-parse --verify -q "$rev^{commit}") || { echo "ab-binaries.sh: $spec: no such commit"; exit 1; }
      git -C "$wt" reset -q --hard && git -C "$wt" checkout -q --detach "$rev" || exit 1
      echo "== $name: $(git -C "$wt" log --oneline -1)"
      for pf in "${patches[@]}"; do
        [ -f "$ROOT/$pf" ] && git -C "$wt" apply "$ROOT/$pf" || { echo "ab-binaries.sh: $spec: $pf does not apply"; exit 1; }
        echo "   + $pf"
      done
      t=$(date +%s)
      # shellcheck disable=SC2046
      cmake -G Ninja -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF \
        -DKILN_BUILD_TESTS=OFF $("$ROOT/scripts/device-cmake-args.sh") > "$wt/configure.log" 2>&1 &&
        cmake --build "$wt/build" --target kiln_cli > "$wt/build.log" 2>&1 ||
        { grep -E "error" -A3 "$wt/configure.log" "$wt/build.log" | head -30; exit 1; }
      strip -o "$wt/kiln-$name" "$wt/build/bin/kiln" && xz -T0 -6 -c "$wt/kiln-$name" > "build-ab/kiln-$name.xz" &&
        rm -f "$wt/kiln-$name" || exit 1
      echo "   build-ab/kiln-$name.xz: $(du -h "build-ab/kiln-$name.xz" | cut -f1), $(( $(date +%s) - t )) s"
    done
    echo "$@" | tr ' ' '\n' | sed 's/=.*//' > build-ab/order.txt
    echo "carry: build-ab ($(du -sh build-ab | cut -f1) of the 64 MiB)"
    ;;
  run)
    filter="" repeats=40 rounds=2
    env_names=() env_sets=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --filter) filter=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --env)
          en=${2%%:*}
          [ "$en" != "$2" ] && [ -n "$en" ] || { echo "ab-binaries.sh run: --env $2 is not NAME:VAR=V ..."; exit 1; }
          env_names+=("$en"); env_sets+=("${2#*:}"); shift 2 ;;
        *) echo "ab-binaries.sh run: unknown argument $1"; exit 1 ;;
      esac
    done
    OUT=${OUT:-$PWD/out}
    mkdir -p "$OUT" build-ab/runs
    names=()
    if [ -f build-ab/order.txt ]; then mapfile -t names < build-ab/order.txt
    elif compgen -G "build-ab/kiln-*.xz" > /dev/null; then
      for x in build-ab/kiln-*.xz; do n=${x#build-ab/kiln-}; names+=("${n%.xz}"); done
    elif [ -x build-gpu/bin/kiln ]; then
      ln -sf ../build-gpu/bin/kiln build-ab/kiln-default && names=(default)
    fi
    [ ${#names[@]} -gt 0 ] || { echo "ab-binaries.sh run: no build in build-ab and no build-gpu/bin/kiln"; exit 1; }
    # A variant named like a build would write that build's run files (its column would hold the variant's runs).
    for en in "${env_names[@]}"; do
      for n in "${names[@]}"; do
        [ "$en" != "$n" ] || { echo "ab-binaries.sh run: --env name $en is also a build's name"; exit 1; }
      done
    done
    for n in "${names[@]}"; do
      [ -x "build-ab/kiln-$n" ] || { xz -dc "build-ab/kiln-$n.xz" > "build-ab/kiln-$n" && chmod +x "build-ab/kiln-$n"; } || exit 1
      if ! "build-ab/kiln-$n" --help > /dev/null 2>&1; then
        echo "== kiln-$n does not start:"; "build-ab/kiln-$n" --help 2>&1 | tail -3; ldd "build-ab/kiln-$n" | grep "not found"
        exit 1
      fi
    done
    args=(--repeats "$repeats")
    [ -n "$filter" ] && args+=(--filter "$filter")
    for r in $(seq 1 "$rounds"); do
      for n in "${names[@]}"; do
        t=$(date +%s)
        timeout "${OPS_TIMEOUT:-400}" "build-ab/kiln-$n" bench ops --json "build-ab/runs/$n-$r.json" "${args[@]}" \
          > "build-ab/runs/$n-$r.log" 2>&1
        echo "== round $r, $n: rc=$?, $(( $(date +%s) - t )) s"
      done
      for i in "${!env_names[@]}"; do
        n=${env_names[$i]}
        t=$(date +%s)
        # shellcheck disable=SC2086
        env ${env_sets[$i]} timeout "${OPS_TIMEOUT:-400}" "build-ab/kiln-${names[0]}" bench ops \
          --json "build-ab/runs/$n-$r.json" "${args[@]}" > "build-ab/runs/$n-$r.log" 2>&1
        echo "== round $r, $n (${names[0]} with ${env_sets[$i]}): rc=$?, $(( $(date +%s) - t )) s"
      done
    done
    names+=("${env_names[@]}")
    python3 - "$OUT" "$rounds" "${names[@]}" <<'EOF'
import json, math, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs, times = {}, {}
for n in names:
    for r in range(1, rounds + 1):
        try:
            with open(f"build-ab/runs/{n}-{r}.json") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        runs[f"{n}-{r}"] = d
        for c in d.get("cases", []):
            if c.get("graph_us"):
                times.setdefault(c["name"], {}).setdefault(n, []).append(c["graph_us"])
with open(f"{out}/ab_runs.json", "w") as f:
    json.dump(runs, f, indent=1)
base = names[0]
lines = ["Graph-replayed µs per call: each build's runs (rounds in order), their median; ratio = build / "
         f"{base} (below 1: faster).", "",
         "| case | " + " | ".join(f"{n} (runs)" for n in names) + " | " +
         " | ".join(f"{n} / {base}" for n in names[1:]) + " |",
         "| --- |" + " ---: |" * (2 * len(names) - 1)]
fam = {}
for case, per in times.items():
    med = {n: statistics.median(per[n]) for n in per}
    cells = [" / ".join(f"{v:.2f}" for v in per.get(n, [])) or "-" for n in names]
    ratios = []
    for n in names[1:]:
        q = med[n] / med[base] if n in med and base in med else None
        ratios.append("-" if q is None else f"{q:.3f}")
        if q is not None:
            fam.setdefault((case.split("/")[0], n), []).append(q)
    lines.append(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
lines += ["", "| family | build | cases | geomean time / " + base + " | range |", "| --- | --- | ---: | ---: | --- |"]
for (family, n), qs in sorted(fam.items()):
    g = math.exp(sum(math.log(q) for q in qs) / len(qs))
    lines.append(f"| {family} | {n} | {len(qs)} | {g:.3f} | {min(qs):.3f}-{max(qs):.3f} |")
with open(f"{out}/ab_table.md", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines[-(len(fam) + 2):]))
EOF
    ;;
  *)
    sed -n 2,22p "$0"
    exit 1
    ;;
esac
