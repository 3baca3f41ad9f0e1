#!/bin/sh
# Fails if libshardd exports a symbol not named shardd_*, or lacks a function the public header declares.
# Usage: check-exports.sh LIBSHARDD.so HEADER
set -eu
lib=$1 header=$2
nm=${NM:-nm}
command -v "$nm" >/dev/null 2>&1 || { echo "$nm not found: skipping"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardd-exports.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# "ADDRESS TYPE NAME" for every defined dynamic symbol. Names the linker adds
# to any shared object are not part of our API and may not exist at all.
"$nm" -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' |
  grep -vxE '_init|_fini|__bss_start|_edata|_end|_etext|__data_start|_DYNAMIC|_GLOBAL_OFFSET_TABLE_' |
  sort -u > "$tmp/exported"

status=0
if grep -v '^shardd_' "$tmp/exported" > "$tmp/stray"; then
  echo "FAIL: $lib exports symbols outside the shardd_ namespace:"
  sed 's/^/  /' "$tmp/stray"
  status=1
fi

# Every function the header marks SHARDD_EXPORT must be there for trainers to link.
grep -v '^[[:space:]]*#' "$header" | tr '\n' ' ' | grep -oE 'SHARDD_EXPORT[^;(]*\(' |
  sed -E 's/\($//; s/.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*$/\1/' |
  sort -u > "$tmp/declared"
[ -s "$tmp/declared" ] || { echo "FAIL: no SHARDD_EXPORT declarations found in $header"; exit 1; }
if comm -23 "$tmp/declared" "$tmp/exported" | grep . > "$tmp/missing"; then
  echo "FAIL: declared in $(basename "$header") but not exported by $lib:"
  sed 's/^/  /' "$tmp/missing"
  status=1
fi

echo "$(wc -l < "$tmp/exported") exported, $(wc -l < "$tmp/declared") declared"
exit $status
