#!/usr/bin/env bash
# Installs the kernel-side toolchain (idempotent) and writes $CACHE/env.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PKGS=(linux-source-6.12 rustc-web rust-web-src libclang-dev qemu-system-x86
      busybox-static cpio bc flex bison libelf-dev libssl-dev xz-utils make
      python3)   # python3: the guest test of userlib/python/hrperf.py
SUDO=; [[ $(id -u) == 0 ]] || SUDO=sudo

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "apt: installing ${missing[*]}"
    $SUDO apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${PKGS[@]}" >&2
else
    log "apt: all packages present"
fi

# Debian's bindgen is too old for 6.12 (needs >= 0.65.1).
BINDGEN=$CACHE/tools/bin/bindgen
if [[ -x $BINDGEN ]] && "$BINDGEN" --version >/dev/null 2>&1; then
    log "bindgen: $("$BINDGEN" --version) present"
else
    command -v cargo >/dev/null || die "cargo not found (needed once to install bindgen-cli)"
    log "bindgen: cargo install bindgen-cli into $CACHE/tools (~2 min)"
    cargo install bindgen-cli --locked --root "$CACHE/tools" >&2
fi

# std source matching /usr/bin/rustc; the version moves, so glob for it.
RUSTC_VER=$(/usr/bin/rustc --version | awk '{print $2}')
RUST_LIB_SRC=/usr/src/rustc-$RUSTC_VER/library
if [[ ! -d $RUST_LIB_SRC ]]; then
    RUST_LIB_SRC=$(printf '%s\n' /usr/src/rustc-*/library | sort -V | tail -n1)
    [[ -d $RUST_LIB_SRC ]] || die "no /usr/src/rustc-*/library (rust-web-src)"
    log "warning: no std source for rustc $RUSTC_VER, using $RUST_LIB_SRC"
fi

# Explicit tools on every kernel make, else kbuild picks the rustup rustc (no rust-src).
cat > "$CACHE/env.sh.tmp" <<ENV
# Written by tools/vm/setup.sh
export HRPERF_CACHE='$CACHE'
export BINDGEN='$BINDGEN'
export RUST_LIB_SRC='$RUST_LIB_SRC'
export KMAKE_ARGS='ARCH=x86_64 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc HOSTRUSTC=/usr/bin/rustc BINDGEN=$BINDGEN RUST_LIB_SRC=$RUST_LIB_SRC'
ENV
mv "$CACHE/env.sh.tmp" "$CACHE/env.sh"
log "rustc $RUSTC_VER, $("$BINDGEN" --version), env: $CACHE/env.sh"
