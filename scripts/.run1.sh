set -u
O=$OUT; mkdir -p /tmp/o; export OUT=/tmp/o
t=$(date +%s)
cmake -G Ninja -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BUILD_BENCH=OFF > /tmp/o/cfg.log 2>&1
cmake --build build-gpu -j 16 --target kiln_cli kiln_cuda_linear_tests kiln_nn_tests kiln_cuda_matmul_tests kiln_cuda_graph_tests > /tmp/o/build.log 2>&1 || { grep -E "error" -A3 /tmp/o/build.log | head -40; }
echo "build $(( $(date +%s) - t )) s"
for t in kiln_cuda_linear_tests kiln_nn_tests kiln_cuda_matmul_tests kiln_cuda_graph_tests; do
  ./build-gpu/tests/$t > /tmp/o/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/o/$t.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" -A4 /tmp/o/$t.log | head -30
done
scripts/device-bench.sh --filter '^linear/' --repeats 100 > /tmp/o/bench.log 2>&1
tail -5 /tmp/o/bench.log
cp /tmp/o/ops_table.md /tmp/o/kiln_ops.json /tmp/o/torch_ops.json $O/ 2>/dev/null
tar czf $O/logs.tgz -C /tmp/o . 
