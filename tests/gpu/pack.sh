#!/usr/bin/env bash
# Pack a build for the GPU machine (it reaches no package registry): the binaries of BUILD and the shared libraries
# that machine lacks (../shared/tools/gpu-libs.sh LIBS, with WITH_BLAS=1) into one xz tarball, under the carry limit.
#   tests/gpu/pack.sh BUILD LIBS OUT.tar.xz
# There: tar -xJf OUT.tar.xz && export LD_LIBRARY_PATH=$PWD/gpulibs/lib && BUILD=gpubuild tests/gpu/run_all.sh quick
set -euo pipefail
build=$1 libs=$2 out=$3
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/gpubuild" "$t/gpulibs"
for d in bin gpu bench tests; do [ -d "$build/$d" ] && cp -a "$build/$d" "$t/gpubuild/"; done
cp -a "$libs/lib" "$t/gpulibs/"
find "$t/gpubuild" -name '*.d' -o -name '*.o' | xargs -r rm -f
tar -C "$t" -cJf "$out" gpubuild gpulibs
echo "$out: $(du -k "$out" | cut -f1) KiB"
