#!/usr/bin/env bash
# Prints the CMake arguments that point at PCRE2 / utf8proc unpacked by scripts/fetch-device-deps.sh (static
# libraries), when .deps/root exists; nothing otherwise.
root="$(cd "$(dirname "$0")/.." && pwd)/.deps/root"
lib="$root/usr/lib/x86_64-linux-gnu"
if [ -f "$lib/libpcre2-8.a" ] && [ -f "$lib/libutf8proc.a" ]; then
  echo "-DKILN_PCRE2_INCLUDE=$root/usr/include -DKILN_PCRE2=$lib/libpcre2-8.a" \
       "-DKILN_UTF8PROC_INCLUDE=$root/usr/include -DKILN_UTF8PROC=$lib/libutf8proc.a"
fi
