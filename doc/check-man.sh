#!/bin/sh
# Renders each man page with groff and fails on any warning, or on a .TH that does not match the file name.
set -eu
command -v groff >/dev/null 2>&1 || { echo "groff not found: skipping"; exit 77; }
status=0
for page in "$@"; do
  base=$(basename "$page")
  name=${base%.*} sec=${base##*.}
  # -ww: all warnings; -z: no output, only diagnostics.
  warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  if [ -n "$warnings" ]; then
    echo "FAIL: $base: groff warnings:"; echo "$warnings"; status=1
  fi
  th=$(sed -n 's/^\.TH \([^ ]*\) \([^ ]*\) .*/\1 \2/p' "$page" | sed 's/\\-/-/g')
  want="$(echo "$name" | tr '[:lower:]' '[:upper:]') $sec"
  if [ "$th" != "$want" ]; then
    echo "FAIL: $base: .TH says '$th', want '$want'"; status=1
  fi
  [ $status -ne 0 ] || echo "$base: clean"
done
exit $status
