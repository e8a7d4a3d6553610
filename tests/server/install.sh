#!/bin/sh
# Setup step of the server tests (ctest fixture): installs the pinned client
# packages (openai, the OpenAI Agents SDK, LangChain, the AI SDK; package-lock.json) into
# tests/server/node_modules, again whenever package.json or the lock file
# changed since the last install (their checksum is kept in node_modules). It
# never fails: when npm or the registry is unreachable, the tests themselves
# report SKIP (exit 77).
cd "$(dirname "$0")" || exit 0
stamp=node_modules/.kvllm-installed
want="$(cat package.json package-lock.json | cksum)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "client packages already installed"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found: the server tests will be skipped"
  exit 0
fi
if timeout 150 npm ci --no-audit --no-fund --prefer-offline --fetch-retries=1 \
     --fetch-timeout=30000 --loglevel=error; then
  echo "$want" > "$stamp"
  echo "installed: $(ls node_modules)"
else
  echo "npm ci failed (no registry access?): the server tests will be skipped"
  rm -rf node_modules
fi
exit 0
