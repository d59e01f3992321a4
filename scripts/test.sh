#!/usr/bin/env bash
# The whole test suite: installs what the tests need (npm packages for the
# tokenizer-parity and OpenAI-client tests, when npm is present), then runs every
# Go test with the race detector where a C toolchain allows it.
set -euo pipefail
cd "$(dirname "$0")/.."

for setup in scripts/test-setup.sh scripts/setup-*.sh; do
	if [ -f "$setup" ]; then bash "$setup"; fi
done

race=()
if command -v gcc >/dev/null 2>&1; then
	export CGO_ENABLED=1
	race=(-race)
else
	echo "test.sh: no C compiler, running without -race" >&2
	export CGO_ENABLED=0
fi
# Portable Go kernels, with the race detector where possible.
go test "${race[@]}" -timeout 60m ./...
# The SIMD kernels (simd/archsimd, amd64 only) are a separate build of the
# same packages: run the whole suite again in that build. compute/cuda's g++
# host emulations (half of the suite's time) compile and run C++ that this
# build does not change, so its second pass is -short: they ran above.
if [ "$(go env GOARCH)" = amd64 ]; then
	GOEXPERIMENT=simd go test -timeout 60m $(go list ./... | grep -vx moxie/compute/cuda)
	GOEXPERIMENT=simd go test -short -timeout 60m ./compute/cuda
fi
