#!/usr/bin/env bash
# On the GPU machine, after a Release build in build-gpu (scripts/device-test.sh): racecheck on single linear and
# FP8 tests with one kernel-name filter each, to find the kiln kernel under which racecheck stops with
# "Internal Sanitizer Error: failed to handle a hardware exception". One log per filter in $OUT/rcb/, and a line
# each: the exit status, whether the internal error appeared, the tests passed and racecheck's summary.
# $OUT/rcb/kernels.txt lists the kiln kernels in the linear test executable.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
B=build-gpu
T=$B/tests/kiln_cuda_linear_tests
F=$B/tests/kiln_cuda_fp8_tests
mkdir -p "$OUT/rcb"
cuobjdump -symbols "$T" 2>/dev/null | grep -i 'STT_FUNC.*kiln' | awk '{print $NF}' | c++filt | sed 's/(.*//' | sort -u > "$OUT/rcb/kernels.txt"
one() {  # name executable gtest-filter [compute-sanitizer options]
  local n=$1 x=$2 f=$3
  shift 3
  timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 99 "$@" "$x" --gtest_filter="$f" > "$OUT/rcb/$n.log" 2>&1
  echo "$n: exit $? internal=$(grep -c 'Internal Sanitizer' "$OUT/rcb/$n.log") ok=$(grep -c '^\[       OK' "$OUT/rcb/$n.log") $(grep -E 'SUMMARY' "$OUT/rcb/$n.log" | tail -1)"
}
L=CudaLinear.DefaultPathMatchesCpu
for k in kiln gemv elementwise fill uniform normal fp8_quant copy reduce; do one "lin-$k" "$T" "$L" --kernel-name "kns=$k" & done
one lin-nogemv "$T" "$L" --kernel-name kns=kiln --kernel-name-exclude kns=gemv &
one lin-exact "$T" CudaLinear.GemvIsExactOnIntegerData --kernel-name kns=gemv &
one fp8-gemv "$F" CudaFp8Linear.EveryOneRowKernelShapeMatchesCpu --kernel-name kns=gemv &
one fp8-quant "$F" CudaFp8.QuantiseMatchesCpuBitForBit --kernel-name kns=kiln &
wait
for f in "$OUT/rcb/lin-kiln.log" "$OUT/rcb/lin-gemv.log"; do echo "== $f"; grep -v '^\[' "$f" | head -30; done
