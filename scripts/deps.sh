# Sourced by scripts/test and scripts/demo: installs the Debian packages shardd needs, once.
# Idempotent: asks dpkg what is missing and installs only that, non-interactively.

shardd_packages=(
  build-essential pkg-config meson ninja-build
  libuv1-dev liburing-dev libjansson-dev libssl-dev
  libisal-dev                                                # CRC-32C of every shard file's data (ISA-L)
  libmicrohttpd-dev                                          # metrics_listen: GET /metrics
  libcriterion-dev
  ncat python3 python3-numpy
  python3-venv python3-pip python3-setuptools python3-wheel   # the pip-install test (tests/python)
  valgrind
  fio                                                        # the reference writer of the benchmarks
  iproute2 nftables                                          # the network-namespace hosts of test_netns
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

# The one Python environment of the binding's torch tests, benchmarks and examples: torch first,
# so that nothing installed after it swaps in another build. Idempotent: a stamp in the venv
# records what it holds, and a venv that holds exactly that is left alone.
SHARDD_VENV=${SHARDD_VENV:-$PWD/.venv}
shardd_venv_torch="torch==2.13.0"
# crc32c: an independent check of the recorded checksums. megatron-core 0.16.1 is the last for
# Python 3.11; its dist_checkpointing needs psutil (undeclared) and its MoE layers einops.
# accelerate: transformers' from_pretrained(distributed_config=...) (its own tensor and expert
# parallel, test_moe) requires it.
shardd_venv_rest=(transformers safetensors huggingface_hub numpy pytest crc32c megatron-core==0.16.1 psutil einops accelerate
                  peft)

shardd_venv() {
  local stamp="$SHARDD_VENV/.shardd-packages" want="$shardd_venv_torch ${shardd_venv_rest[*]}"
  if [ -x "$SHARDD_VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "venv: $SHARDD_VENV holds $want"
    return 0
  fi
  # Debian's python3 makes the venv; torch 2.13.0's CPU build for it comes from the local wheel
  # directory pip is configured with, else from PyTorch's CPU index (never PyPI's CUDA build).
  local py=/usr/bin/python3 pip
  echo "venv: making $SHARDD_VENV with $($py --version)"
  $py -m venv "$SHARDD_VENV"
  pip=("$SHARDD_VENV/bin/python" -m pip install -q --disable-pip-version-check)
  if ! "${pip[@]}" --only-binary=:all: "$shardd_venv_torch" 2>/dev/null ||
     ! "$SHARDD_VENV/bin/python" -c 'import torch, sys; sys.exit("+cpu" not in torch.__version__ and torch.version.cuda is not None)'; then
    "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "$shardd_venv_torch"
  fi
  "${pip[@]}" "${shardd_venv_rest[@]}"
  "$SHARDD_VENV/bin/python" -c 'import torch, transformers, safetensors, huggingface_hub, numpy, pytest
print("venv: torch", torch.__version__, "transformers", transformers.__version__)'
  echo "$want" > "$stamp"
}

# The Python package into the venv the way docs/pytorch.md's pip section installs it, with this
# build tree's libshardd recorded, so the venv's python and torchrun import shardd with no
# PYTHONPATH or LIBSHARDD. A test's PYTHONPATH (its own tree's client/python) still comes first.
# pip writes client/python/build and *.egg-info (both git-ignored). shardd_venv_package BUILD_DIR
shardd_venv_package() {
  local build=${1:-build}
  LIBSHARDD="$PWD/$build/client/libshardd.so" "$SHARDD_VENV/bin/python" -m pip install -q \
      --disable-pip-version-check --no-build-isolation --no-index --no-deps --force-reinstall ./client/python || return 1
  echo "venv: shardd installed, libshardd at $PWD/$build/client/libshardd.so"
}
