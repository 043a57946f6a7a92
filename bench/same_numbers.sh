#!/usr/bin/env bash
# Every job of issue 16's "same numbers" check, on the code of the checkout this script lies in:
#   bash bench/same_numbers.sh OUT INPUTS
# INPUTS (created when missing, then reused, so two code versions read the same model and corpus): a tiny
# random Llama (tests/_tiny.py) and a prepared corpus. Run it once per code version, e.g. main before a
# change from a `git worktree add /tmp/before <rev>`, then compare job by job:
#   for d in analyze study eval-zero eval-mean bi; do python bench/compare_runs.py BEFORE/$d AFTER/$d; done
# (a BEFORE from before the one results header, issue 24: add --header, and for bi also
#  --ignore timings versions params preset: its recipe block is the typed config now)
# and the fixed-seed training run by its weights: sha256sum {BEFORE,AFTER}/train/checkpoints/*/model.safetensors
# (~2 min on 2 cores; fp32, one thread, fixed seeds).
set -euo pipefail
OUT=$(realpath -m "$1"); IN=$(realpath -m "$2")
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD/tests OMP_NUM_THREADS=1
PY=${PYTHON:-python}
if [ ! -d "$IN/llama" ]; then
  mkdir -p "$IN/c"
  $PY -c "
from pathlib import Path
from _tiny import tiny_llama_dir
from test_train_helpers import make_corpus
tiny_llama_dir(Path('$IN/llama'))
make_corpus(Path('$IN/c'), n_lines=3000)"
fi
M=$IN/llama; C=$IN/c/shards; mkdir -p "$OUT"
IL="$PY -m inductionlab.cli"
$IL analyze --model $M --out $OUT/analyze --dtype float32 --n-permutations 4 --list-length 30 \
   --cue-position 15 --ks 1,2 --n-draws 2 --score-seq-len 10 --score-batch-size 4 --top 3 --quiet \
   --method mean --batch-size 3 --threads 1
$IL study temporal --model $M --out $OUT/study --dtype float32 --permutations 5 --list-length 30 \
   --cue-position 15 --recall-trials 4 --recall-list-length 6 --recall-shots 2 --ks 1,2 --n-draws 2 \
   --load-bearing-top 2 --load-bearing-permutations 4 --batch-size 3 --no-progress --threads 1 --method mean
$IL train $($PY -c "
from pathlib import Path
from test_train_helpers import tiny_flags
print(' '.join(tiny_flags(Path('$C'), Path('$OUT/train'))))")
for meth in zero mean; do
  $IL evaluate $OUT/train --shards $C --out $OUT/eval-$meth --prompts 3 --ablate per-layer-2pct,top-2 --draws 2 \
     --icl-sequences 3 --score-seq-len 12 --score-batch-size 4 --induction-seq-len 12 --perplexity-tokens 1024 \
     --dtype float32 --quiet --tasks copy,list_last,next_letter --method $meth --batch-size 5 --threads 1
done
$IL study bi-induct --preset tiny --shards $C --out $OUT/bi --quiet
