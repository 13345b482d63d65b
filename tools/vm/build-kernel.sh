#!/usr/bin/env bash
# Builds (or reuses) the test kernel; prints its build dir as the last stdout line.
# KDIR=<your built tree> skips all of this.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

if [[ -n ${KDIR:-} ]]; then
    [[ -f $KDIR/Module.symvers ]] || die "KDIR=$KDIR has no Module.symvers (run its 'make modules')"
    log "kernel: using KDIR=$KDIR"
    echo "$KDIR"; exit 0
fi
load_env

TARBALL=/usr/src/linux-source-6.12.tar.xz
FRAGMENT=$VM_DIR/kernel.config
[[ -f $TARBALL ]] || die "$TARBALL missing: run tools/vm/setup.sh"
SRC_VER=$(dpkg-query -W -f='${Version}' linux-source-6.12)

# Anything that changes the kernel binary or its Rust ABI must change the key.
KEY=$( { echo "key-v1"; echo "$SRC_VER"; cat "$FRAGMENT"
         /usr/bin/rustc --version; "$BINDGEN" --version; gcc --version | head -n1
       } | sha256sum | cut -c1-16)
SRC=$CACHE/src/linux-$SRC_VER
OUT=$CACHE/kernel/$KEY
mkdir -p "$CACHE/src" "$CACHE/kernel"

# One builder at a time per key; a second caller waits, then reuses.
exec 9>"$OUT.lock"
flock 9

if [[ -f $OUT/arch/x86/boot/bzImage && -f $OUT/Module.symvers ]]; then
    log "kernel: cached $OUT"
else
    if [[ ! -f $SRC/.unpacked ]]; then
        log "kernel: unpacking $TARBALL ($SRC_VER)"
        rm -rf "$SRC" "$SRC.tmp"; mkdir -p "$SRC.tmp"
        tar -xf "$TARBALL" -C "$SRC.tmp" --strip-components=1
        touch "$SRC.tmp/.unpacked"; mv "$SRC.tmp" "$SRC"
    fi
    K=(make -C "$SRC" O="$OUT" "${KMAKE[@]}")
    mkdir -p "$OUT"
    "${K[@]}" rustavailable >&2
    log "kernel: configuring $OUT (tinyconfig + kernel.config)"
    "${K[@]}" tinyconfig >&2
    "$SRC/scripts/kconfig/merge_config.sh" -m -O "$OUT" "$OUT/.config" "$FRAGMENT" >&2
    "${K[@]}" olddefconfig >&2
    # Kconfig silently drops options whose dependencies are unmet: say which.
    while read -r line; do
        grep -qxF "$line" "$OUT/.config" || log "warning: not in final .config: $line"
    done < <(grep -E '^(CONFIG_|# CONFIG_.* is not set)' "$FRAGMENT")
    grep -qx 'CONFIG_RUST=y' "$OUT/.config" || die "CONFIG_RUST did not survive olddefconfig"
    start=$SECONDS
    log "kernel: building bzImage + modules_prepare (-j3, 4-7 min)"
    "${K[@]}" -j3 bzImage modules_prepare >&2
    # Without 'modules' there is no Module.symvers and modpost rejects every symbol.
    "${K[@]}" -j3 modules >&2
    log "kernel: built in $((SECONDS - start)) s"
fi
echo "$OUT" > "$CACHE/kernel/current"
echo "$OUT"
