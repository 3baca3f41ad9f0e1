#!/usr/bin/env bash
# Memcheck pass for scripts/test: the parser, framing and reader unit suites, and a real daemon serving the hostile-client suite.
#
# usage: scripts/valgrind.sh [BUILD_DIR]   (default: build, a non-sanitized tree)
#
# Criterion runs each test in a child process that it execs, so children are
# traced (--trace-children=yes); it ignores a child's valgrind exit status
# (Criterion issue #137), so the per-process logs are checked instead: memcheck
# reports are the "==PID==" lines (warnings about syscalls valgrind does not know,
# "--PID--", are not errors). Every child pays valgrind's start-up (2-4 s here:
# symbols of the ~20 libraries libcriterion pulls in), so by default only the
# framing and base64 suites run under it (SHARDD_VALGRIND_UNIT="msg linebuf
# base64 reader ..." picks others); everything else is covered by the ASan+UBSan
# tree. The request parser, framing, sessions, saves and writer run under
# memcheck in the daemon itself: it serves the whole hostile-client suite
# (SHARDD_WRAPPER, read by tests/integration/xclient.c) and must exit 0 on
# SIGTERM, which --error-exitcode turns into "no error, no definite leak".
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
for t in ${SHARDD_VALGRIND_UNIT:-linebuf base64}; do
  echo "valgrind: unit suite $t"
  "${vg[@]}" --trace-children=yes --log-file="$logs/unit-$t.%p.log" \
    "$build/tests/unit/test_$t" --jobs 2 >"$logs/unit-$t.out" 2>&1 &
  runner=$!
  wait $runner || {
    echo "valgrind: unit suite $t failed:" >&2
    cat "$logs/unit-$t.out" >&2
    status=1
  }
  # The runner itself only schedules tests (it runs none) and leaks a little of
  # criterion's own memory now and then; its log is not about our code.
  rm -f "$logs/unit-$t.$runner.log"
done
for f in "$logs"/unit-*.log; do
  [ -e "$f" ] || continue
  if grep -qE '^==[0-9]+==' "$f"; then
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
  [ -e "$f" ] || continue
  if grep -qE '^==[0-9]+==' "$f"; then
    echo "valgrind: memcheck report for the daemon ($(basename "$f")):" >&2
    cat "$f" >&2
    status=1
  fi
done

echo "valgrind: done in $(( $(date +%s) - start )) s, $([ $status -eq 0 ] && echo clean || echo FAILED)"
exit $status
