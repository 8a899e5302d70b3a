#!/usr/bin/env bash
# check_cuda_plugin.sh PLUGIN FLASHATTN_COMMAND
#
# The CUDA plug-in's packaging promise (DESIGN.md §6), checked on any machine, GPU or not:
#  - libflashattn_cuda.so exports exactly one symbol, fa_cuda_plugin_entry;
#  - it needs neither libcudart (the runtime is linked in statically) nor libcuda (the runtime
#    opens the driver at run time), so only the NVIDIA driver is needed where it runs;
#  - it holds machine code for every architecture the build asked for (cuobjdump, if present);
#  - libflashattn finds it next to itself and accepts its ABI handshake (`flashattn info`
#    names the file; without a GPU or driver it then says why the driver cannot be used).
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 libflashattn_cuda.so path/to/flashattn" >&2
    exit 2
fi
plugin=$1
tool=$2
status=0

exports=$(nm -D --defined-only "$plugin" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' |
          grep -Ev '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u)
echo "== exports: $exports"
if [ "$exports" != "fa_cuda_plugin_entry" ]; then
    echo "FAIL: the plug-in must export exactly fa_cuda_plugin_entry"
    status=1
fi

needed=$(readelf -d "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "== NEEDED:" $needed
if echo "$needed" | grep -Eq '^libcuda(rt)?\.so'; then
    echo "FAIL: the plug-in links libcudart or libcuda dynamically; it must need only the driver"
    status=1
fi

if [ -n "${FA_CUDA_ARCHS:-}" ] && command -v cuobjdump >/dev/null; then
    have=$(cuobjdump --list-elf "$plugin" | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
    echo "== machine code for: $have"
    for arch in ${FA_CUDA_ARCHS//[;,]/ }; do
        if ! grep -qw "sm_$arch" <<<"$have"; then
            echo "FAIL: no sm_$arch machine code in the plug-in"
            status=1
        fi
    done
fi

info=$(env -u FA_CUDA_PLUGIN "$tool" info)
echo "$info" | grep -E '^(build|backends|  )' | sed 's/^/   /'
if ! grep -q "cuda: plug-in /" <<<"$info"; then
    echo "FAIL: libflashattn did not load the plug-in built next to it (see the build line)"
    status=1
fi

[ $status -eq 0 ] && echo "PASS: plug-in exports, dependencies and handshake"
exit $status
