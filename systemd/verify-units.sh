#!/bin/sh
# Checks the generated units with systemd-analyze verify and applies sysusers/tmpfiles entries to a scratch root.
# Usage: verify-units.sh SERVICE SOCKET SYSUSERS TMPFILES BUILT_DAEMON INSTALLED_DAEMON ROOT MANDIR CONF SYSCONFDIR
# Exit 77 (meson's "skipped") only when systemd-analyze is not installed.
set -eu

service=$1 socket=$2 sysusers=$3 tmpfiles=$4 built=$5 installed=$6 root=$7 mandir=$8 conf=$9 sysconfdir=${10}

fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- the generated shardd.conf: valid, and naming the units' root and socket ----
# systemd wants absolute paths; meson passes built files relative to the build dir.
case $built in /*) ;; *) built=$PWD/$built ;; esac
grep -qx "ExecStart=$installed --config $sysconfdir/shardd/shardd.conf" "$service" ||
  fail "$service: ExecStart does not pass --config $sysconfdir/shardd/shardd.conf"
eff=$("$built" --check-config --config "$conf") || fail "shardd --check-config refuses $conf"
echo "$eff" | grep -qx "root = $root" || fail "$conf: root is not $root: $eff"
echo "$eff" | grep -qx "socket = /run/shardd/shardd.sock" || fail "$conf: socket is not /run/shardd/shardd.sock"
if grep -n '@[A-Z_]*@' "$conf"; then fail "$conf: unsubstituted template variables left"; fi
echo "shardd --check-config: $conf valid ($(echo "$eff" | grep -c ' = ') settings)"

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not found: skipping"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardd-units.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# ---- the generated files carry the install paths ------------------------------
grep -qx "ExecStart=$installed --config .*/shardd/shardd.conf" "$service" ||
  fail "$service: ExecStart is not '$installed --config .../shardd/shardd.conf'"
grep -qx "ReadWritePaths=$root" "$service" || fail "$service: ReadWritePaths is not $root"
# No privilege: arenas come as descriptors, so the service needs no capability.
grep -qx "AmbientCapabilities=" "$service" && grep -qx "CapabilityBoundingSet=" "$service" ||
  fail "$service: the service must run with no capabilities (empty AmbientCapabilities= and CapabilityBoundingSet=)"
if grep -n 'CAP_' "$service"; then fail "$service: names a capability"; fi
grep -qx "ListenStream=/run/shardd/shardd.sock" "$socket" ||
  fail "$socket: ListenStream does not match the client default /run/shardd/shardd.sock"
if grep -n '@[A-Z_]*@' "$service" "$socket" "$sysusers" "$tmpfiles"; then
  fail "unsubstituted template variables left"
fi

# ---- systemd-analyze verify ----------------------------------------------------
# verify insists that ExecStart= names an existing executable: point the copy
# at the daemon just built, and change nothing else.
mkdir "$tmp/units"
sed "s|^ExecStart=$installed |ExecStart=$built |" "$service" > "$tmp/units/shardd.service"
cp "$socket" "$tmp/units/shardd.socket"
grep -q "^ExecStart=$built " "$tmp/units/shardd.service" || fail "could not redirect ExecStart"

# Documentation=man:... entries are checked with man(1): offer it our pages.
for page in "$mandir"/*.[0-9]; do
  [ -e "$page" ] || continue
  sec=${page##*.}
  mkdir -p "$tmp/man/man$sec"
  ln -s "$page" "$tmp/man/man$sec/"
done
man_opt=--man=no
if [ -d "$tmp/man" ] && command -v man >/dev/null 2>&1; then man_opt=--man=yes; fi

# verify exits 0 on mere warnings (unknown keys, bad values it ignores), so
# any line naming our units fails the test too.
set +e
MANPATH="$tmp/man" SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$man_opt" \
  "$tmp/units/shardd.socket" "$tmp/units/shardd.service" > "$tmp/verify.log" 2>&1
rc=$?
set -e
cat "$tmp/verify.log"
[ "$rc" -eq 0 ] || fail "systemd-analyze verify exited $rc"
if grep -q 'shardd' "$tmp/verify.log"; then
  fail "systemd-analyze verify complained about the units"
fi
echo "systemd-analyze verify ($man_opt): shardd.service and shardd.socket clean"

# The exposure score is informative (it varies between systemd versions).
systemd-analyze security --offline=yes "$tmp/units/shardd.service" 2>/dev/null |
  grep -i 'overall exposure' || true

# ---- sysusers.d and tmpfiles.d entries in a scratch root -------------------------
mkdir -p "$tmp/root/etc"
command -v systemd-sysusers >/dev/null 2>&1 || { echo "systemd-sysusers missing: done"; exit 0; }
systemd-sysusers --root="$tmp/root" - < "$sysusers"
grep -q '^shardd:x:[0-9]*:[0-9]*:[^:]*:[^:]*:.*nologin$' "$tmp/root/etc/passwd" ||
  fail "sysusers did not create a nologin user shardd: $(cat "$tmp/root/etc/passwd")"
grep -q '^shardd:x:[0-9]*:' "$tmp/root/etc/group" || fail "sysusers did not create group shardd"
uid=$(sed -n 's/^shardd:x:\([0-9]*\):.*/\1/p' "$tmp/root/etc/passwd")
gid=$(sed -n 's/^shardd:x:\([0-9]*\):.*/\1/p' "$tmp/root/etc/group")
echo "sysusers: user shardd uid $uid gid $gid"

if [ "$(id -u)" -ne 0 ]; then
  echo "not root: tmpfiles entry not applied (chown needs root)"
  exit 0
fi
command -v systemd-tmpfiles >/dev/null 2>&1 || { echo "systemd-tmpfiles missing: done"; exit 0; }
systemd-tmpfiles --root="$tmp/root" --create - < "$tmpfiles"
got=$(stat -c '%F %a %u %g' "$tmp/root$root")
[ "$got" = "directory 750 $uid $gid" ] ||
  fail "tmpfiles made $root as '$got', want 'directory 750 $uid $gid'"
echo "tmpfiles: $root created as $got"
