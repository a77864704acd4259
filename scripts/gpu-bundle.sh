#!/bin/bash
# Here, before a GPU lease: the shared recipe's vLLM 0.24 bundle (../shared/gpu/build_bundle.sh) cut in pieces small
# enough to travel beside this repository. The recipe cuts 45 MB pieces; with the repository's tracked files (26 MB
# since the stored H200 runs) a transfer would pass its 64 MiB. Usage: scripts/gpu-bundle.sh [DEST=.gpu] [PIECE_BYTES]
# Then, on the lent machine, one call per folder in order: `bash scripts/gpu-setup.sh .gpu` carrying .gpu/c1, .gpu/c2,
# ... (four folders since the repository passed 26 MB; the last holds the checksum and the wheels).
set -eu
DEST=${1:-.gpu}; PIECE=${2:-32000000}
sum=$(ls "$DEST"/c*/vllm.sha256 2>/dev/null | head -1)
[ -n "$sum" ] || { bash ../shared/gpu/build_bundle.sh "$DEST"; sum=$DEST/c3/vllm.sha256; }
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
[ $((tree + PIECE)) -lt $((64 * 1048576 - 1048576)) ] || { echo "gpu-bundle: $tree B of repository + $PIECE B pieces pass 63 MiB"; exit 1; }
tmp=$(mktemp -d); cat "$DEST"/c*/vllm.part* > "$tmp/vllm.tar.xz"
[ "$(sha256sum < "$tmp/vllm.tar.xz" | cut -d' ' -f1)" = "$(cat "$sum")" ] || { echo "gpu-bundle: checksum"; exit 1; }
rm -f "$DEST"/c*/vllm.part*
split -b "$PIECE" -d -a 1 "$tmp/vllm.tar.xz" "$tmp/vllm.part"
n=$(ls "$tmp"/vllm.part* | wc -l); [ "$n" -le 4 ] || { echo "gpu-bundle: $n pieces; give a larger PIECE_BYTES"; exit 1; }
i=1; for part in "$tmp"/vllm.part*; do mkdir -p "$DEST/c$i"; mv "$part" "$DEST/c$i/"; i=$((i + 1)); done
# the checksum and the wheels travel last: gpu-setup.sh unpacks once the checksum has come
last=$(dirname "$sum"); [ "$last" = "$DEST/c$n" ] || mv "$last"/whl "$sum" "$DEST/c$n/"
# the repository's own dependencies that the recipe's bundle lacks (orjson since 2026-12-07; gguf, which reads the
# real-weights GGUF, at the version the cpu extra installed here), as wheels for the lent machine's Python 3.12,
# installed with the recipe's by gpu-setup.sh
pins="$(grep -E '^orjson==' constraints.txt) $(.venv/bin/python -c \
  'import importlib.metadata as m; print("gguf==" + m.version("gguf"))' 2>/dev/null || echo gguf)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
  -d "$DEST/c$n/whl" $pins
rm -rf "$tmp"; du -sh "$DEST"/c*
