#!/usr/bin/env bash
# The main job: set up a fresh machine, build, pretrain a small transformer on
# the default corpus (Debian's fortunes) for a few minutes on 2 cores, then
# print text sampled from it. Extra arguments go to `rt-train pretrain`
# (e.g. --activation-checkpointing block, --steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target rt-train rt-generate

out=runs/demo
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
./build/rt-train pretrain --output "$out" --steps 600 --batch 8 --sequence-length 128 \
  --eval-interval 100 --checkpoint-interval 200 "$@"

echo
echo "== sample (rt-generate --model $out/model.safetensors --prompt 'The ') =="
./build/rt-generate --model "$out/model.safetensors" --prompt "The " --max-new-tokens 120 --temperature 0.8 --top-k 40 --seed 7
echo
echo "loss curve: $out/loss_curve.svg   metrics: $out/metrics.jsonl   run metadata: $out/metadata.json"
