#!/bin/sh
# One device call for issue 8: train the miniature, convert it with moxie
# import-hf, measure held-out perplexity of the converted checkpoint in
# transformers, and pack the results into $OUT (at most 8 files of <= 16 MiB).
# Run from the repository root on the device machine, with training/data and
# .carry/moxie carried (see training/README.md). Extra arguments go to
# train_mini.py train (e.g. --steps N to repeat a schedule exactly).
set -eu
: "${OUT:?set OUT to the folder whose files come back}"
W=/tmp/mini
rm -rf "$W"
mkdir -p "$W"
# whatever happens, the training log comes back
trap 'cp -f "$W/train.log" "$OUT/train.log" 2>/dev/null || true' EXIT
export PYTHONUNBUFFERED=1
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())'
sha256sum training/data/train.txt training/data/heldout.txt
python3 training/train_mini.py train training/data "$W" "$@"
.carry/moxie import-hf "$W/hf" --out "$W/model" --shard-size 16MiB
python3 training/train_mini.py eval training/data "$W/model" --json "$W/eval_export.json"
mkdir -p "$W/results"
for f in train.log loss.csv loss.png metrics.json hf_config_transformers.json eval_export.json; do
	[ -f "$W/$f" ] && cp "$W/$f" "$W/results/"
done
tar czf "$OUT/results.tgz" -C "$W" results
tar cf - -C "$W" model | split -b 16000000 - "$OUT/model.tar."
ls -l "$OUT"
