# Sourced by scripts/test and scripts/demo: installs the Debian packages shardd needs, once.
# Idempotent: asks dpkg what is missing and installs only that, non-interactively.

shardd_packages=(
  build-essential pkg-config meson ninja-build
  libuv1-dev liburing-dev libjansson-dev libssl-dev
  libmicrohttpd-dev                                          # metrics_listen: GET /metrics
  libcriterion-dev
  ncat python3 python3-numpy python3-torch
  python3-venv python3-pip python3-setuptools python3-wheel   # the pip-install test (tests/python)
  valgrind
  clang libclang-rt-14-dev
)

shardd_install_deps() {
  local missing=() p
  for p in "${shardd_packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all ${#shardd_packages[@]} packages present"
    return 0
  fi
  echo "deps: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures (once) and builds a meson tree: shardd_build DIR [meson options...]
shardd_build() {
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@"
  fi
  ninja -C "$dir"
}
