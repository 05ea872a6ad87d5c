#!/usr/bin/env bash
# Keeps what travels to the GPU machine under its 64 MiB (counted on disk) when prebuilt executables are carried:
#   scripts/device-slim.sh on    leave the tiny model's weights (49 MB) and the fuzz corpus (4,800 small files,
#                                21 MiB on disk) out of the index and ignore them; nothing on disk changes
#   scripts/device-slim.sh off   put them back in the index
# Never commit while it is on: the commit would delete them.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/kiln-tiny/model.safetensors
exclude=.git/info/exclude
case "${1:-}" in
  on)
    if git ls-files --error-unmatch "$model" > /dev/null 2>&1; then
      git rm -q --cached "$model" && echo "/$model" >> "$exclude"
    fi
    if [ -n "$(git ls-files fuzz/corpus | head -1)" ]; then
      git rm -r -q --cached fuzz/corpus && echo "/fuzz/corpus/" >> "$exclude"
    fi
    ;;
  off)
    git reset -q -- "$model" fuzz/corpus
    sed -i "\#^/$model\$#d; \#^/fuzz/corpus/\$#d" "$exclude"
    ;;
  *) sed -n 2,6p "$0"; exit 2 ;;
esac
