#!/usr/bin/env bash
# Builds out-of-tree kernel modules; prints the built .ko paths on stdout.
# Usage: build-modules.sh [module dir, relative to the repo]...  (default: MODULE_DIRS)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
load_env
cd "$REPO"   # so dirs and globs below are repo-relative

# The core goes first: format modules link against its Module.symvers.
CORE_DIR=core-kmod/kmod
MODULE_DIRS=("$CORE_DIR" formats/delta/kmod formats/pebs/kmod formats/aggregate/kmod formats/llc-stack/kmod)   # tools/vm/selftest: toolchain check only
(($#)) && MODULE_DIRS=("$@")

KDIR=$("$VM_DIR/build-kernel.sh" | tail -n1)

# 6.12 writes module objects next to the sources (no MO=), so build in a mirror
# of the repo outside the checkout; relative #[path]s keep working there.
TREE=$CACHE/modules/$(echo "$REPO $KDIR" | sha256sum | cut -c1-12)
mkdir -p "$TREE"
tar --exclude=./.git --exclude=./target -cf - . | tar -C "$TREE" -xf -

for dir in "${MODULE_DIRS[@]}"; do
    [[ -f $dir/Kbuild || -f $dir/Makefile ]] || die "modules: no Kbuild in $REPO/$dir"
    extra=()
    if [[ $dir != "$CORE_DIR" && -f $TREE/$CORE_DIR/Module.symvers ]]; then
        extra=(KBUILD_EXTRA_SYMBOLS="$TREE/$CORE_DIR/Module.symvers")
    fi
    log "modules: building $dir"
    start=$SECONDS
    # The modules must build warning-free (rustc, gcc, objtool, modpost).
    out=$(make -C "$KDIR" M="$TREE/$dir" "${KMAKE[@]}" "${extra[@]}" modules 2>&1) \
        || { echo "$out" >&2; die "modules: $dir failed to build"; }
    echo "$out" >&2
    ! grep -qi 'warning' <<<"$out" || die "modules: $dir built with warnings (see above)"
    log "modules: $dir built in $((SECONDS - start)) s"
    ls "$TREE/$dir"/*.ko
done
