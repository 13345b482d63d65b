#!/bin/sh
# Runs inside the QEMU guest (see initramfs.sh): load, check, unload the selftest module.
set -e
insmod /hello_selftest.ko
dmesg | grep -q 'hrperf selftest: init'
rmmod hello_selftest
dmesg | grep -q 'hrperf selftest: exit'
echo "selftest module loaded and unloaded"
