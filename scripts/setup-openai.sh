#!/usr/bin/env bash
# Installs the official openai npm client (pinned in
# server/testdata/npm/package-lock.json) that server/openai_client_test.go runs
# against a live moxie server. Idempotent and quick when the pinned version is
# already installed; without npm it does nothing (the test then skips).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=server/testdata/npm
pkg=openai
version=6.30.1

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
	exit 0
fi
have=""
if [ -f "$dir/node_modules/$pkg/package.json" ]; then
	have=$(cd "$dir" && node -p "require('./node_modules/$pkg/package.json').version" 2>/dev/null || true)
fi
if [ "$have" = "$version" ]; then
	exit 0
fi
echo "setup-openai.sh: installing $pkg@$version into $dir" >&2
(cd "$dir" && npm ci --no-audit --no-fund --silent)
