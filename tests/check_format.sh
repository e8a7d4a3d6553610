#!/bin/sh
# The format_check CTest: every C file of the tree is as clang-format (with
# the repository's .clang-format) would write it. Prints the files that are
# not, and the command that fixes them. Exits 77 (skipped) without clang-format.
# usage: check_format.sh SRC_DIR
set -eu
cd "$1"
command -v clang-format >/dev/null 2>&1 || { echo "clang-format is not installed"; exit 77; }
bad=""
for f in $(find src tools tests/unit tests/fuzz bench -name '*.[ch]' | sort); do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
    echo "not formatted (fix with: clang-format -i$bad)"
    exit 1
fi
echo "all C files formatted"
