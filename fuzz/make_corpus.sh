#!/usr/bin/env bash
# Seed corpora for the fuzzers, made from real runs of this build:
#   bash fuzz/make_corpus.sh BUILD_DIR OUT_DIR
# A tiny pretraining run (interrupted after a training checkpoint, then
# completed) gives a model state and a training checkpoint; a LoRA
# post-training run gives an adapter; the shipped chat example and a few
# hand-made lines seed the chat/JSON fuzzer. The model has the dimensions the
# harnesses use ({256, 32, 16, 2, 2, 32}).
set -euo pipefail
build=${1:?usage: make_corpus.sh BUILD_DIR OUT_DIR}
out=${2:?usage: make_corpus.sh BUILD_DIR OUT_DIR}
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for c in model_state adapter_state training_checkpoint chat_data c_abi hf_llama tokenizer; do mkdir -p "$out/$c"; done
seq 1 300 | sed 's/^/the quick brown fox jumps over the lazy dog /' > "$work/corpus.txt"
tiny=(--data "$work/corpus.txt" --context-length 32 --model-width 16 --heads 2 --layers 2
      --feed-forward-width 32 --batch 2 --sequence-length 16 --eval-batches 1 --eval-interval 0 --quiet)

# An interrupted run keeps its training checkpoint: stop it with a short
# timeout while it trains 100000 steps with a checkpoint every step.
( timeout -s KILL 3 "$build/rt-train" pretrain "${tiny[@]}" --steps 100000 --checkpoint-interval 1 \
  --output "$work/ckpt" >/dev/null 2>&1 || true ) 2>/dev/null
if [ -f "$work/ckpt/training_checkpoint.safetensors" ]; then
  cp "$work/ckpt/training_checkpoint.safetensors" "$out/training_checkpoint/seed-checkpoint"
fi
"$build/rt-train" pretrain "${tiny[@]}" --steps 3 --checkpoint-interval 0 --output "$work/pre" >/dev/null 2>&1
cp "$work/pre/model.safetensors" "$out/model_state/seed-model"
"$build/rt-train" post-train --base-model "$work/pre/model.safetensors" --data "$root/data/chat_example.jsonl" \
  --steps 1 --batch 2 --sequence-length 16 --eval-batches 1 --lora-rank 2 --lora-targets all \
  --output "$work/post" --quiet >/dev/null 2>&1
cp "$work/post/adapter.safetensors" "$out/adapter_state/seed-adapter"
cp "$work/post/adapter.safetensors" "$out/model_state/seed-adapter"
cp "$work/pre/model.safetensors" "$out/c_abi/seed-model"              # the C ABI's file entry points
cp "$work/post/adapter.safetensors" "$out/c_abi/seed-adapter"

# Hugging Face checkpoint files, each behind the byte that picks its slot (fuzz_hf_llama.cpp).
"$build/rt-convert" --to-hf "$work/pre/model.safetensors" --output "$work/hf" >/dev/null
{ printf '\000'; cat "$work/hf/config.json"; } > "$out/hf_llama/seed-config"
{ printf '\001'; cat "$work/hf/model.safetensors"; } > "$out/hf_llama/seed-weights"
{ printf '\002'; python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; names = json.loads(f.read(n))
print(json.dumps({"metadata": {}, "weight_map": {k: "shard-1.safetensors" for k in names if k != "__metadata__"}}))' \
  "$work/hf/model.safetensors"; } > "$out/hf_llama/seed-index"

head -c 4096 "$root/data/chat_example.jsonl" > "$out/chat_data/seed-example"
head -c 2048 "$work/corpus.txt" > "$out/chat_data/seed-text"            # a text corpus for TextDataset
printf '{"prompt": "a", "response": "b"}\n' > "$out/chat_data/seed-one"
printf '{"step": 3, "loss": 1.5, "validation_loss": null}\n' > "$out/chat_data/seed-metrics"
printf '{"vocab_size": 256, "context_length": 32, "model_width": 16, "heads": 2, "layers": 2, "feed_forward_width": 32}' \
  > "$out/chat_data/seed-dimensions"
# SentencePiece models (BPE and unigram) for the tokenizer fuzzer.
"$build/rt-train" tokenizer --data "$root/data/chat_example.jsonl" --vocab-size 400 \
  --output "$out/tokenizer/seed-bpe" >/dev/null 2>&1
"$build/rt-train" tokenizer --data "$root/data/chat_example.jsonl" --vocab-size 400 --model-type unigram \
  --output "$out/tokenizer/seed-unigram" >/dev/null 2>&1
echo "[make_corpus] seeds in $out: $(find "$out" -type f | wc -l) files"
