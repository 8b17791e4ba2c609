#!/bin/bash
# gpu-speed call 1: tests of the new build, per-kernel profile (base vs new), bench rows (base vs new).
C=build-gpu-carry
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/machine.txt
echo "== tests (new build)"
timeout 60 $C/test_cuda_kernels > $OUT/tests.log 2>&1; echo "kernels rc=$?"
timeout 60 $C/test_cuda_model >> $OUT/tests.log 2>&1; echo "model rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" $OUT/tests.log | head -30
G="--vocab 256 --width 768 --heads 12 --layers 12 --seq 1024 --batch 16 --backend cuda --attention flash"
D="--vocab 256 --width 128 --heads 4 --layers 32 --seq 1024 --batch 16 --backend cuda --attention flash"
echo "== profile (disabled, 1 step, serialized)"
for bin in base new; do for s in G D; do
  eval args=\$$s
  echo "### $bin $s" >> $OUT/profile.txt
  RIFTCO_CUDA_PROFILE=1 timeout 40 $C/rt-bench-step-$bin $args --policy disabled --warmup 0 --steps 1 >> $OUT/profile.txt 2>&1
  echo "$bin $s rc=$?"
done; done
grep -A12 "###\|RIFTCO_CUDA_PROFILE total" $OUT/profile.txt | grep -v "^--$" | head -80
echo "== bench"
for s in G D; do for pol in disabled block; do for bin in base new; do
  eval args=\$$s
  out=$(timeout 40 $C/rt-bench-step-$bin $args --policy $pol --warmup 1 --steps 3 2>&1); rc=$?
  echo "{\"row\": \"$bin $s $pol\", \"rc\": $rc, \"result\": $(echo "$out" | tail -1)}" >> $OUT/bench.jsonl
  echo "$bin $s $pol rc=$rc $(echo "$out" | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print("step %.1f ms fwd %.1f bwd %.1f peak %.1f MiB times %s losses %s" % (r["step_seconds"]*1e3, r["forward_seconds"]*1e3, r["backward_seconds"]*1e3, r["peak_bytes"]/2**20, [round(t*1e3,1) for t in r["step_times"]], r["losses"]))' 2>/dev/null || echo "$out" | tail -2)"
done; done; done
