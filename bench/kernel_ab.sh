#!/bin/sh
# Kernel A/B in one process: this tree's kernels against those of another
# revision, on the same weights, alternating call by call (bench_kernels.c,
# bench_ab). Separate runs of two binaries drift with the machine's memory
# bandwidth (22-57 GB/s minute to minute here); one process alternating the two
# sees the same minute for both, and the ratio's median over hundreds of
# pairs moves by a percent or two between runs.
#
# Usage: bench/kernel_ab.sh BASE_REV [isa] [k] [n_out] [types]
#   e.g. bench/kernel_ab.sh HEAD~1 avx512 4096 4096 Q5_0,Q3_K
# Environment: as bench_kernels (BENCH_LAYOUT, BENCH_HUGE, BENCH_WS_KB), and
#   BENCH_AB_M      activation rows (1: decode, the default)
#   BENCH_AB_PAIRS  pairs timed (400)
#   OMP_NUM_THREADS threads (default 2)
#   CC              compiler (gcc)
# Prints per type and layout the median and quartiles of time(this tree) /
# time(base), below 1 when this tree is faster, and whether the outputs are
# bit-identical.
#
# How: the base revision's src/kernels is compiled from `git archive`, linked
# into one object whose defined symbols are renamed base_* (objcopy), and
# linked with bench_kernels.c and this tree's kernels; both use this tree's
# base and gguf layers, so their interfaces must not have changed between the
# two revisions. Needs git, binutils (ld, nm, objcopy) and OpenMP.
set -eu
[ $# -ge 1 ] || { sed -n '2,27p' "$0"; exit 2; }
base=$1
shift
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git rev-parse --verify -q "$base^{commit}" >/dev/null || { echo "kernel_ab: no revision $base" >&2; exit 2; }
git archive "$base" src/base src/gguf src/kernels | tar -x -C "$tmp"
flags="-std=gnu11 -O2 -fopenmp"
inc="-I$tmp/src -I$tmp/src/base -I$tmp/src/gguf -I$tmp/src/kernels"
for f in "$tmp"/src/kernels/[a-z]*.c; do
    $CC $flags $inc -c "$f" -o "$tmp/$(basename "$f" .c).o"
done
ld -r -o "$tmp/base_kernels.o" "$tmp"/*.o
nm -g --defined-only "$tmp/base_kernels.o" | awk '{print $3 " base_" $3}' > "$tmp/syms"
objcopy --redefine-syms="$tmp/syms" "$tmp/base_kernels.o"
mkdir -p build
$CC $flags -DBENCH_AB_BASE -Isrc -Isrc/base -Isrc/gguf -Isrc/kernels src/base/base.c \
    src/base/kvl_pool.c src/gguf/gguf_types.c src/kernels/[a-z]*.c bench/bench_kernels.c \
    "$tmp/base_kernels.o" -o build/kernel_ab -lm -lpthread
echo "kernel_ab: this tree ($(git describe --always --dirty)) against $base ($(git rev-parse --short "$base"))"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} BENCH_AB=1 build/kernel_ab "$@"
