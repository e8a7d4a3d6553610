#!/bin/sh
# Runs one server test script: run.sh TEST.mjs KVLLM_BINARY REPO_ROOT.
# Exit 77 (ctest SKIP) when node or the openai package is missing.
dir="$(dirname "$0")"
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed (make deps installs nodejs and npm)"
  exit 77
fi
if [ ! -f "$dir/node_modules/openai/package.json" ]; then
  echo "SKIP: the openai npm package is not installed (npm ci failed: no registry access?)"
  exit 77
fi
exec node "$@"
