#!/bin/bash
# Activation offload on the H200 (issue 18 step 4): tests, memcheck, benchmark rows.
# As run: copied with build-cuda/tests/test_cuda_model and build-cuda/rt-bench-step
# (built here for sm_90) into build-gpu-carry/ of the checkout, then
# `bash build-gpu-carry/run.sh` on the device machine; outputs go to $OUT.
C=build-gpu-carry
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/machine.txt
echo "== offload + neighbouring tests"
timeout 100 $C/test_cuda_model 2>&1 | tee $OUT/tests.log | grep -E "^\[  (FAILED|PASSED) |OK \] CudaActivation|Failure|error|Expected|Which is|gradient|logits" | head -60
echo "rc=${PIPESTATUS[0]}"
echo "== bench (GPT-2-small width, block; deep narrow, block)"
G="--vocab 256 --width 768 --heads 12 --layers 12 --seq 1024 --batch 16 --backend cuda --attention flash --warmup 1 --steps 3"
D="--vocab 256 --width 128 --heads 4 --layers 32 --seq 1024 --batch 16 --backend cuda --attention flash --warmup 1 --steps 3"
for row in "gpt2 block off:$G --policy block" "gpt2 block on:$G --policy block --activation-offload" \
           "gpt2 segments off:$G --policy segments" "gpt2 segments on:$G --policy segments --activation-offload" \
           "gpt2 block off2:$G --policy block" "gpt2 block on2:$G --policy block --activation-offload" \
           "deep block off:$D --policy block" "deep block on:$D --policy block --activation-offload"; do
  name=${row%%:*}; args=${row#*:}
  out=$(timeout 40 $C/rt-bench-step $args 2>&1); rc=$?
  echo "{\"row\": \"$name\", \"rc\": $rc, \"result\": $(echo "$out" | tail -1)}" >> $OUT/bench.jsonl
  echo "$name rc=$rc $(echo "$out" | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print("step %.1f ms fwd %.1f bwd %.1f peak %.1f MiB host_peak %.1f MiB times %s losses %s" % (r["step_seconds"]*1e3, r["forward_seconds"]*1e3, r["backward_seconds"]*1e3, r["peak_bytes"]/2**20, r["host_peak_bytes"]/2**20, [round(t*1e3,1) for t in r["step_times"]], r["losses"]))' 2>/dev/null || echo "$out" | tail -2)"
done
echo "== memcheck (offload tests)"
timeout 60 compute-sanitizer --tool memcheck $C/test_cuda_model --gtest_filter='CudaActivationOffload.*' > $OUT/memcheck.log 2>&1
echo "rc=$?"; tail -3 $OUT/memcheck.log
