#!/usr/bin/env bash
# The GPU machine has no libpcre2-dev / libutf8proc-dev / libcpp-httplib-dev and cannot download: fetch the
# Debian packages here, unpack them into .deps/root (git-ignored via .git/info/exclude), and carry `.deps` to
# the device. The device scripts (device-test.sh, device-bench.sh) then link PCRE2 and utf8proc statically
# from there, and cpp-httplib (for `kiln serve`) as a shared library found through the build's RPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
(cd .deps/debs && apt-get download libpcre2-dev libutf8proc-dev libcpp-httplib-dev libcpp-httplib0.11)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
# Only what the build uses travels (the working tree sent to the device is limited to 64 MiB): the headers, the
# two static libraries and cpp-httplib's shared one.
rm -rf .deps/root/usr/share
find .deps/root/usr/lib -name "libpcre2-16*" -o -name "libpcre2-32*" -o -name "libpcre2-posix*" -o -name "*.so" -o -name pkgconfig |
  xargs rm -rf
grep -qx "/.deps/" .git/info/exclude 2>/dev/null || echo "/.deps/" >> .git/info/exclude
echo "fetch-device-deps: .deps/root ready; pass carry=[\".deps/root\"] to the device run"
