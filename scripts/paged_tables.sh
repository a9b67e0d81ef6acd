#!/usr/bin/env bash
# The paged-KV tables of README.md ("Paged and quantized KV"): SmolLM2 on
# WikiText-2 at a 20% H2O budget, token eviction without / with compaction
# vs page eviction vs the full cache at page sizes 8/16/32 (every token a
# decode step), and the batch that fits a fixed KV memory.
#   bash scripts/paged_tables.sh [OUT_DIR]      (about 12 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
S=${KVSLIM_SHARED:-../shared}
OUT=${1:-paged-results}
mkdir -p "$OUT"
cargo build --release -q
K=./target/release/kvslim
SMOL=$S/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=$S/data/wikitext2/wiki.test.raw
H2O="h2o:heavy=10%,recent=10%"

specs=("full" "$H2O")
for p in 8 16 32; do
  specs+=("$H2O,page=$p" "$H2O,page=$p,compact=64" "$H2O,page=$p,page_score=max")
done
specs+=("$H2O,kv_dtype=q8" "full:kv_dtype=q8" "full:kv_dtype=f16")
i=0
for spec in "${specs[@]}"; do
  i=$((i + 1))
  echo "[$i/${#specs[@]}] $spec" >&2
  $K perplexity --model "$SMOL" --text "$TEXT" --max-tokens 1024 --threads 2 \
    --policy "$spec" --compare-full --json > "$OUT/ppl-$i.json"
done

python3 - "$OUT" <<'EOF'
import glob, json, sys
out = sys.argv[1]
rows = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/ppl-*.json"), key=lambda f: int(f.split("-")[-1][:-5]))]
print("| policy | ppl | KL vs full | pages peak / final | KV MiB peak | fragmentation (mean) | moved B/step | decode ms/step | decode tok/s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    p = r.get("paged")
    kl = r.get("compare_full", {}).get("kl_mean")
    print("| `{}` | {:.3f} | {} | {} | {:.2f} | {} | {} | {:.1f} | {:.0f} |".format(
        r["policy"], r["ppl"], "-" if kl is None else f"{kl:.4f}",
        f"{p['pages_peak']} / {p['pages_final']}" if p else "-",
        r["kv_bytes_peak"] / 2**20,
        f"{p['fragmentation_mean_pct']:.1f}%" if p else "-",
        f"{p['bytes_moved_per_step']:.0f}" if p else "-",
        r["decode_ms_median"], 1000 / r["decode_ms_median"]))
EOF

P="$OUT/plan.json"
$K calibrate --model "$SMOL" --text "$TEXT" --samples 64 --out "$P" > /dev/null
$K bench --model "$SMOL" --kv-memory 64MiB --prompt-file "$TEXT" --prompt-len 512 --gen-len 128 --threads 2 \
  --policy full --policy "full:page=16" --policy "$H2O" --policy "$H2O,kv_dtype=q8" --policy "$H2O,kv_dtype=q4" \
  --policy "$H2O,page=16,page_score=max" --policy "$H2O,page=16,page_score=max,kv_dtype=q8" \
  --policy "$H2O+chai:plan=$P" --policy "$H2O,kv_dtype=q8+chai:plan=$P" --out "$OUT/capacity.json"

# the seed's three curves: budget → quality, → peak KV bytes, → time per token
# (results.md/csv and plots/ under $OUT/curves)
$K eval --model "$SMOL" --out "$OUT/curves" --threads 2 --no-compare-full \
  --policies "h2o;h2o:page=16;h2o:page=16,compact=64;h2o:page=16,page_score=max" --budgets 40%,20%,10%,5% \
  --tasks "ppl:$TEXT,seq_len=512,limit=2"
