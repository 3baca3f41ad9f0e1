#!/usr/bin/env bash
# Memcheck pass for scripts/test: the parser, framing and reader unit suites, and a real daemon serving the hostile-client suite.
#
# usage: scripts/valgrind.sh [BUILD_DIR]   (default: build, a non-sanitized tree)
#
# Criterion runs each test in a child process, so children are traced; it ignores
# a child's valgrind exit status (Criterion issue #137), so the per-process logs
# are checked instead: with -q a log holds something only when memcheck found an
# error or a definite leak. Every child pays valgrind's start-up (~2 s here), so
# only the suites that parse untrusted bytes run under it; everything else is
# covered by the ASan+UBSan tree. The daemon runs under valgrind for the whole
# hostile-client suite (SHARDD_WRAPPER, read by tests/integration/xclient.c) and
# must exit 0 on SIGTERM, which --error-exitcode turns into "no error, no leak".
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

if ! command -v valgrind >/dev/null; then
  echo "valgrind: not installed (scripts/deps.sh installs it); skipping" >&2
  exit 0
fi

logs=$(mktemp -d /tmp/shardd-valgrind-XXXXXX)
trap 'rm -rf "$logs"' EXIT
vg=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --num-callers=30)

start=$(date +%s)
status=0
for t in msg linebuf base64 reader; do
  echo "valgrind: unit suite $t"
  "${vg[@]}" --trace-children=yes --log-file="$logs/unit-$t.%p.log" \
    "$build/tests/unit/test_$t" --jobs 4 >"$logs/unit-$t.out" 2>&1 || {
    echo "valgrind: unit suite $t failed:" >&2
    cat "$logs/unit-$t.out" >&2
    status=1
  }
done
for f in "$logs"/unit-*.log; do
  if [ -s "$f" ]; then
    echo "valgrind: memcheck report in $(basename "$f"):" >&2
    cat "$f" >&2
    status=1
  fi
done

echo "valgrind: daemon under memcheck, hostile-client suite"
if ! SHARDD="$PWD/$build/daemon/shardd" SHARDCTL="$PWD/$build/client/shardctl" \
     SHARDD_EXAMPLE_RANK="$PWD/$build/client/shardd-example-rank" \
     SHARDD_WRAPPER="${vg[*]} --log-file=$logs/daemon.%p.log" \
     "$build/tests/integration/test_hostile" --jobs 1 >"$logs/hostile.out" 2>&1; then
  echo "valgrind: the hostile suite failed with the daemon under memcheck:" >&2
  cat "$logs/hostile.out" >&2
  status=1
fi
for f in "$logs"/daemon.*.log; do
  if [ -s "$f" ]; then
    echo "valgrind: memcheck report for the daemon ($(basename "$f")):" >&2
    cat "$f" >&2
    status=1
  fi
done

echo "valgrind: done in $(( $(date +%s) - start )) s, $([ $status -eq 0 ] && echo clean || echo FAILED)"
exit $status
