#!/bin/sh
# Installs the build into a scratch DESTDIR, checks what landed, and links a program against it via pkg-config.
# Usage: install_test.sh BUILD_DIR "CC..." ["EXTRA_CFLAGS..."]
set -eu
build=$1 cc=$2 extra=${3:-}
# meson test points this at the build tree; only the installed library counts here.
unset LD_LIBRARY_PATH

fail() { echo "FAIL: $*" >&2; exit 1; }
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found: skipping"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardd-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest

# --no-rebuild: meson test has just built the tree; install only copies.
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install --destdir failed"; }

# ---- what landed ---------------------------------------------------------------
find "$dest" \( -type f -o -type l \) | sed "s|^$dest||" | sort > "$tmp/files"
for want in /sbin/shardd /bin/shardctl /include/shardd/shardd.h /pkgconfig/shardd.pc \
            /libshardd.so /libshardd.so.0 /libshardd.so.0.1.0 \
            /man8/shardd.8 /man5/shardd.conf.5 /man1/shardctl.1 /man7/shardd-protocol.7 \
            /systemd/system/shardd.service /systemd/system/shardd.socket \
            /sysusers.d/shardd.conf /tmpfiles.d/shardd.conf /etc/shardd/shardd.conf; do
  grep -q -- "$want\$" "$tmp/files" || { cat "$tmp/files"; fail "nothing installed as *$want"; }
done
# A mangled install dir (say, from a bad pkg-config lookup) shows up as odd characters.
if grep -v '^[A-Za-z0-9_./+-]*$' "$tmp/files"; then fail "odd characters in installed paths"; fi
echo "installed $(wc -l < "$tmp/files") files"

pc=$(find "$dest" -name shardd.pc | head -n 1)
libdir=$(dirname "$(dirname "$pc")")
[ -L "$libdir/libshardd.so" ] && [ -L "$libdir/libshardd.so.0" ] ||
  fail "libshardd.so and libshardd.so.0 should be symlinks to the versioned file"
soname=$(readelf -d "$libdir/libshardd.so.0.1.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libshardd.so.0 ] || fail "soname is '$soname', want libshardd.so.0"

# Installed programs must not point back into the build tree.
for exe in $(grep -E '/s?bin/' "$tmp/files"); do
  if readelf -d "$dest$exe" | grep -E 'R(UN)?PATH' | grep -q -- "$build"; then
    fail "$exe keeps an RPATH into the build directory"
  fi
done

# ---- a trainer building against the installed library ----------------------------
export PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_SYSROOT_DIR="$dest"   # the .pc names the final prefix, not $dest
flags=$(pkg-config --cflags --libs shardd) || fail "pkg-config --cflags --libs shardd failed"
echo "pkg-config shardd: $flags"
case $flags in *"$dest"*) ;; *) fail "pkg-config flags do not point into DESTDIR: $flags" ;; esac

cat > "$tmp/trainer.c" <<'EOF_C'
#include <shardd/shardd.h>
#include <stdio.h>
int main(void) {
  printf("%s %s|%s|%s|%d\n", SHARDD_VERSION_STRING, shardd_err_name(SHARDD_E_GAP),
         shardd_strerror(SHARDD_E_NO_SPACE), shardd_err_name(12345),
         shardd_err_from_name("client_lost") == SHARDD_E_CLIENT_LOST);
  return 0;
}
EOF_C
# The public header must build cleanly as plain C11 in a user's strict build.
# shellcheck disable=SC2086
$cc -std=c11 -Wall -Wextra -Wpedantic -Werror $extra -o "$tmp/trainer" "$tmp/trainer.c" $flags ||
  fail "cannot compile and link a program against the installed libshardd"

readelf -d "$tmp/trainer" | grep -q 'NEEDED.*\[libshardd.so.0\]' ||
  fail "the program does not record libshardd.so.0 as NEEDED"
LD_LIBRARY_PATH="$libdir" ldd "$tmp/trainer" | grep -q "libshardd.so.0 => $libdir/" ||
  fail "the program would not load the installed libshardd: $(LD_LIBRARY_PATH="$libdir" ldd "$tmp/trainer")"

out=$(LD_LIBRARY_PATH="$libdir" "$tmp/trainer") || fail "the program failed to run"
want="0.1.0 gap|no space left on device|unknown|1"
[ "$out" = "$want" ] || fail "program printed '$out', want '$want'"
echo "linked through pkg-config and ran: $out"
