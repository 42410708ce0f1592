#!/usr/bin/env bash
# Runs openai_client.test.cjs (the official openai npm client against deltaq serve).
# Usage: run_openai_node.sh DELTAQ_BINARY SOURCE_DIR NPM_DIR
# Installs the locked openai package (package-lock.json) into NPM_DIR with `npm ci` when it is
# missing or the lock file changed. Exits 77 (ctest: skipped) when node or npm is not installed.
set -euo pipefail
deltaq=$1 src=$2 npm_dir=$3
here="$src/tests/server"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are needed for the openai client test (Debian/nodesource package nodejs)"
  exit 77
fi
mkdir -p "$npm_dir"
if ! cmp -s "$here/package-lock.json" "$npm_dir/package-lock.json" || [ ! -d "$npm_dir/node_modules/openai" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$npm_dir/"
  (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
export NODE_PATH="$npm_dir/node_modules"
export DELTAQ_BIN="$deltaq" DELTAQ_SRC="$src"
exec node "$here/openai_client.test.cjs"
