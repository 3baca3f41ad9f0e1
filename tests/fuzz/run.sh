#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a bounded time on a copy of its seeds.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     default: 15 s, all targets
#   tests/fuzz/run.sh 0                                    only replay the seed corpora
#
# Env: FUZZ_OUT (build dir, default build-fuzz), FUZZ_CC (default clang),
#      FUZZ_KEEP_CORPUS=DIR (keep the grown corpora there instead of discarding them).
# Seeds are copied to a temporary directory, so the repository is never written;
# a crash leaves its input in $FUZZ_OUT/artifacts/ and the script fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${1:-15}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request reader coverage handshake)
out=${FUZZ_OUT:-build-fuzz}
cc=${FUZZ_CC:-clang}

# ------------------------------------------------------------------------
# Is libFuzzer there? (Debian: clang + libclang-rt-14-dev)
# ------------------------------------------------------------------------
mkdir -p "$out/obj" "$out/artifacts"
probe="$out/probe.c"
rm -f "$out/probe.log"
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe"
if ! command -v "$cc" >/dev/null 2>&1 ||
   ! "$cc" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >"$out/probe.log" 2>&1; then
  echo "fuzz: SKIPPED: '$cc' cannot build libFuzzer targets (install clang and libclang-rt-14-dev)"
  [ -f "$out/probe.log" ] && sed 's/^/fuzz:   /' "$out/probe.log" | head -5
  exit 0
fi

# ------------------------------------------------------------------------
# Build: the proto sources the targets use, plus the daemon's pure path
# checks and peer frames and login, instrumented; each target links them directly.
# ------------------------------------------------------------------------
# All of proto/ (the sdcore library: pure, jansson and ISA-L's CRC only), so a new file there needs no edit here.
proto_srcs=()
for f in proto/*.c; do proto_srcs+=("$(basename "$f" .c)"); done
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
cflags=(-std=gnu11 -g -O1 -Wall -Wextra -Iinclude -Iproto -Idaemon -D_GNU_SOURCE
        $(pkg-config --cflags jansson) $(pkg-config --cflags libuv) $(pkg-config --cflags libcrypto))
libs=($(pkg-config --libs jansson) $(pkg-config --libs libcrypto) $(pkg-config --libs libisal 2>/dev/null || echo -lisal) -lm)
daemon_srcs=(pathsafe log peer_frame peer_auth)

# Everything is recompiled when any source or header they include changed
# (a stale object built against an old struct layout would fake crashes).
stamp="$out/obj/.stamp"
objs=()
for s in "${proto_srcs[@]}"; do objs+=("$out/obj/$s.o"); done
for s in "${daemon_srcs[@]}"; do objs+=("$out/obj/$s.o"); done
if [ ! -f "$stamp" ] || [ -n "$(find proto include daemon/pathsafe.c daemon/log.c daemon/peer_frame.c daemon/peer_auth.c \
                                  daemon/*.h tests/fuzz/run.sh \
                                  -newer "$stamp" -type f -print -quit)" ]; then
  rm -f "$stamp"
  pids=()
  for s in "${proto_srcs[@]}"; do
    "$cc" "${cflags[@]}" "${san[@]}" -fsanitize=fuzzer-no-link -c "proto/$s.c" -o "$out/obj/$s.o" &
    pids+=($!)
  done
  for s in "${daemon_srcs[@]}"; do
    "$cc" "${cflags[@]}" "${san[@]}" -fsanitize=fuzzer-no-link -c "daemon/$s.c" -o "$out/obj/$s.o" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  touch "$stamp"
fi

for t in "${targets[@]}"; do
  src="tests/fuzz/fuzz_$t.c"
  [ -f "$src" ] || { echo "fuzz: no target '$t' ($src)"; exit 2; }
  "$cc" "${cflags[@]}" -Werror "${san[@]}" -fsanitize=fuzzer "$src" "${objs[@]}" "${libs[@]}" -o "$out/fuzz_$t"
done
echo "fuzz: built ${targets[*]} in $out/"

# ------------------------------------------------------------------------
# Run
# ------------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardd-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A smaller quarantine keeps RSS low; jansson allocates on every line.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:quarantine_size_mb=64}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for t in "${targets[@]}"; do
  seeds="tests/fuzz/corpus/$t"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log="$out/fuzz_$t.log"
  if [ "$secs" = 0 ]; then
    # Replay: every seed (and every kept reproducer) must pass.
    if ! "$out/fuzz_$t" -rss_limit_mb=2048 -timeout=5 "$seeds"/* >"$log" 2>&1; then
      echo "fuzz: $t FAILED replaying $seeds (log: $log)"
      grep 'Running: ' "$log" | tail -1
      grep -A3 -m1 -E 'invariant broken|ERROR: |runtime error' "$log" || tail -30 "$log"
      status=1
    else
      echo "fuzz: $t: $(ls "$seeds" | wc -l) seeds replay cleanly"
    fi
    continue
  fi
  corpus="$tmp/$t"
  mkdir -p "$corpus"
  cp -r "$seeds/." "$corpus/"
  if ! "$out/fuzz_$t" "${dict[@]}" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=5 -max_len=8192 \
       -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" "$corpus" >"$log" 2>&1; then
    echo "fuzz: $t FAILED (log: $log; reproducer: $(ls -t "$out/artifacts/$t-"* 2>/dev/null | head -1))"
    grep -A3 -m1 -E 'invariant broken|ERROR: |runtime error' "$log" || tail -30 "$log"
    status=1
    continue
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz: $t: ${secs}s, ${execs:-?} runs, corpus $(ls "$seeds" | wc -l) -> $(ls "$corpus" | wc -l) inputs, no crash"
  if [ -n "${FUZZ_KEEP_CORPUS:-}" ]; then
    mkdir -p "$FUZZ_KEEP_CORPUS/$t"
    cp -r "$corpus/." "$FUZZ_KEEP_CORPUS/$t/"
  fi
done
exit $status
