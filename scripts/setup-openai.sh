#!/usr/bin/env bash
# Installs the official API clients that the server tests run against a live
# moxie server, pinned in server/testdata/npm/package-lock.json: the openai
# npm client (server/openai_client_test.go) and the Anthropic one
# (@anthropic-ai/sdk, server/anthropic_client_test.go). Idempotent and quick
# when the pinned versions are already installed; without npm it does
# nothing (the tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=server/testdata/npm
pins=("openai 6.30.1" "@anthropic-ai/sdk 1.10.0")

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
	exit 0
fi
missing=""
for pin in "${pins[@]}"; do
	pkg=${pin% *}
	version=${pin#* }
	have=""
	if [ -f "$dir/node_modules/$pkg/package.json" ]; then
		have=$(cd "$dir" && node -p "require('./node_modules/$pkg/package.json').version" 2>/dev/null || true)
	fi
	[ "$have" = "$version" ] || missing="$missing $pkg@$version"
done
if [ -z "$missing" ]; then
	exit 0
fi
echo "setup-openai.sh: installing$missing into $dir" >&2
(cd "$dir" && npm ci --no-audit --no-fund --silent)
