#!/bin/bash
# gpu-speed call 2: tests of build A (register-tiled flash backward) and B (+ forward), racecheck on B's flash
# rows, profile of B, gpu_benchmark.py with B (ours vs PyTorch), bench rows of A.
C=build-gpu-carry
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/machine.txt
for x in A B; do
  echo "== tests $x"
  echo "##### $x kernels" >> $OUT/tests.log
  timeout 60 $C/test_cuda_kernels-$x >> $OUT/tests.log 2>&1; echo "kernels $x rc=$?"
  echo "##### $x model" >> $OUT/tests.log
  timeout 60 $C/test_cuda_model-$x >> $OUT/tests.log 2>&1; echo "model $x rc=$?"
done
grep -E "^#####|^\[  (FAILED|PASSED) |Failure|Expected|Which is|max_rel|relative" $OUT/tests.log | head -40
echo "== racecheck B flash"
timeout 25 compute-sanitizer --tool racecheck $C/test_cuda_kernels-B --gtest_filter='*flash*' > $OUT/racecheck.log 2>&1
echo "rc=$?"; tail -3 $OUT/racecheck.log
G="--vocab 256 --width 768 --heads 12 --layers 12 --seq 1024 --batch 16 --backend cuda --attention flash"
D="--vocab 256 --width 128 --heads 4 --layers 32 --seq 1024 --batch 16 --backend cuda --attention flash"
echo "== profile B (disabled, 1 step, serialized)"
for s in G D; do
  eval args=\$$s
  echo "### B $s" >> $OUT/profile.txt
  RIFTCO_CUDA_PROFILE=1 timeout 30 $C/rt-bench-step-B $args --policy disabled --warmup 0 --steps 1 >> $OUT/profile.txt 2>&1
done
grep -A8 "RIFTCO_CUDA_PROFILE total" $OUT/profile.txt
echo "== gpu_benchmark.py with B"
timeout 80 python3 bench/gpu_benchmark.py --bench $C/rt-bench-step-B --out $OUT/gpu --timeout 25 --deadline 55
cat $OUT/gpu/table.md
echo "== bench A rows"
for s in G D; do for pol in disabled block; do
  eval args=\$$s
  out=$(timeout 12 $C/rt-bench-step-A $args --policy $pol --warmup 1 --steps 3 2>&1); rc=$?
  echo "{\"row\": \"A $s $pol\", \"rc\": $rc, \"result\": $(echo "$out" | tail -1)}" >> $OUT/bench.jsonl
  echo "A $s $pol rc=$rc $(echo "$out" | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print("step %.1f ms fwd %.1f bwd %.1f times %s losses %s" % (r["step_seconds"]*1e3, r["forward_seconds"]*1e3, r["backward_seconds"]*1e3, [round(t*1e3,1) for t in r["step_times"]], r["losses"]))' 2>/dev/null || echo "$out" | tail -2)"
done; done
