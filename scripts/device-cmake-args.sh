#!/usr/bin/env bash
# The CMake arguments every build on the GPU machine shares (device-test.sh, device-bench.sh,
# device-check.sh, ab-binaries.sh), so that they reuse one build folder:
# - -lineinfo: line tables in the device code, so compute-sanitizer and Nsight name source lines (no
#   change to the generated code);
# - PCRE2 / utf8proc unpacked by scripts/fetch-device-deps.sh (static libraries), when .deps/root exists;
# - cpp-httplib from there too (a shared library; `kiln serve`), when its dependencies load on the machine.
echo "-DCMAKE_CUDA_FLAGS=-lineinfo"
root="$(cd "$(dirname "$0")/.." && pwd)/.deps/root"
lib="$root/usr/lib/x86_64-linux-gnu"
if [ -f "$lib/libpcre2-8.a" ] && [ -f "$lib/libutf8proc.a" ]; then
  echo "-DKILN_PCRE2_INCLUDE=$root/usr/include -DKILN_PCRE2=$lib/libpcre2-8.a" \
       "-DKILN_UTF8PROC_INCLUDE=$root/usr/include -DKILN_UTF8PROC=$lib/libutf8proc.a"
fi
httplib=$(ls "$lib"/libcpp-httplib.so.* 2> /dev/null | head -1)
if [ -n "$httplib" ] && [ -f "$root/usr/include/httplib.h" ] && ! ldd "$httplib" | grep -q "not found"; then
  echo "-DKILN_HTTPLIB_INCLUDE=$root/usr/include -DKILN_HTTPLIB=$httplib"
fi
# - cuDNN's headers and library (convolutions) from PyTorch's nvidia-cudnn wheel when the system has none.
if ! ls /usr/local/cuda/include/cudnn_backend.h /usr/include/cudnn_backend.h /usr/include/x86_64-linux-gnu/cudnn_backend.h > /dev/null 2>&1; then
  cudnn=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2> /dev/null)
  if [ -n "$cudnn" ] && [ -f "$cudnn/include/cudnn_backend.h" ]; then
    echo "-DKILN_CUDNN_INCLUDE=$cudnn/include -DKILN_CUDNN_LIBRARY=$cudnn/lib/libcudnn.so.9"
  fi
fi
