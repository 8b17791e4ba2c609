#!/usr/bin/env bash
# The main job: set up a fresh machine, build, train a subword tokenizer
# (SentencePiece BPE, 2048 pieces) on the default corpus (Debian's fortunes),
# pretrain a small transformer with it for a few minutes on 2 cores, print
# text sampled from it and its bits per byte on the held-out tail of the
# corpus (rt-eval). Extra arguments go to `rt-train pretrain`
# (e.g. --activation-checkpointing block, --steps 100).
# The byte-level run it replaces, for comparison (README "Main job"):
#   rt-train pretrain --output runs/bytes --steps 600 --batch 8 --sequence-length 128
#   rt-eval --model runs/bytes/model.safetensors --split validation
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target rt-train rt-generate rt-eval

out=runs/demo
tokenizer=runs/demo-tokenizer.model
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# The tokenizer sees only the text the model trains on (the tail that
# pretraining and rt-eval --split validation hold out is left out).
./build/rt-train tokenizer --vocab-size 2048 --validation-fraction 0.1 --output "$tokenizer"
./build/rt-train pretrain --tokenizer "$tokenizer" --output "$out" --steps ${MAIN_STEPS:-3000} --batch 8 \
  --sequence-length 128 --eval-interval 100 --checkpoint-interval 200 "$@"

echo
echo "== sample (rt-generate --model $out/model.safetensors --prompt 'The ') =="
./build/rt-generate --model "$out/model.safetensors" --prompt "The " --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 7
echo
echo "== validation (rt-eval --model $out/model.safetensors --split validation) =="
./build/rt-eval --model "$out/model.safetensors" --split validation
echo "loss curve: $out/loss_curve.svg   metrics: $out/metrics.jsonl   run metadata: $out/metadata.json"
