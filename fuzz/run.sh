#!/usr/bin/env bash
# Bounded runs of every fuzzer (the README's test command runs this):
#   bash fuzz/run.sh FUZZ_BUILD_DIR RELEASE_BUILD_DIR [SECONDS_EACH]
# Seeds come from fuzz/make_corpus.sh (real runs of the release build); each
# fuzzer starts from its seeds plus what earlier runs found (kept in
# FUZZ_BUILD_DIR/corpus) and the inputs that once failed (fuzz/regressions/NAME,
# committed with their fixes), and stops after SECONDS_EACH (default 60). A crash,
# a sanitizer report, a leak or an escaped exception fails the script and
# leaves the input in FUZZ_BUILD_DIR/findings. Prints execs per fuzzer.
set -euo pipefail
fuzz_build=${1:?usage: run.sh FUZZ_BUILD_DIR RELEASE_BUILD_DIR [SECONDS_EACH]}
release_build=${2:?usage: run.sh FUZZ_BUILD_DIR RELEASE_BUILD_DIR [SECONDS_EACH]}
seconds=${3:-60}
here="$(cd "$(dirname "$0")" && pwd)"
seeds="$fuzz_build/seeds"
[ -d "$seeds/tokenizer" ] || bash "$here/make_corpus.sh" "$release_build" "$seeds"
mkdir -p "$fuzz_build/findings"
status=0
passed=0
failed=0
for name in model_state adapter_state training_checkpoint chat_data c_abi hf_llama tokenizer; do
  corpus="$fuzz_build/corpus/$name"
  mkdir -p "$corpus"
  dict=(-dict="$here/safetensors.dict")
  [ "$name" = chat_data ] && dict=(-dict="$here/json.dict")
  [ "$name" = hf_llama ] && dict=(-dict="$here/json.dict")
  [ "$name" = tokenizer ] && dict=()  # protobuf: no dictionary
  log="$fuzz_build/fuzz_$name.log"
  binary="$fuzz_build/fuzz/fuzz_$name"
  [ -x "$binary" ] || { echo "[fuzz] $binary not built"; exit 1; }
  regressions=()  # inputs that once failed (committed): every run tries them first
  [ -d "$here/regressions/$name" ] && regressions=("$here/regressions/$name")
  if OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 "$binary" "$corpus" "$seeds/$name" "${regressions[@]}" \
      "${dict[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
      -artifact_prefix="$fuzz_build/findings/$name-" -print_final_stats=1 > "$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "[fuzz] $name: ${execs:-?} inputs in ${seconds}s, no finding"
    passed=$((passed + 1))
  else
    echo "[fuzz] $name: FINDING (see $log and $fuzz_build/findings)"
    tail -40 "$log"
    status=1
    failed=$((failed + 1))
  fi
done
echo "fuzzers: $passed passed, $failed failed"
exit $status
