# `mpirun -np 2 rt-train ...` end to end (docs/distributed.md): pretrain,
# then LoRA post-train on its model; rank 0 alone prints the result and
# metadata.json records world_size 2; a batch the ranks cannot split is
# refused before any file is written.
#   cmake -DMPIEXEC=... -DNP_FLAG=-n -DRT_TRAIN=... -DSOURCE_DIR=... -DWORK=... -P rt_train_two_ranks.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(text "")
foreach(i RANGE 150)
  string(APPEND text "the quick brown fox jumps over the lazy dog ${i}.\n")
endforeach()
file(WRITE ${WORK}/corpus.txt "${text}")
set(mpirun ${MPIEXEC} ${NP_FLAG} 2 --oversubscribe)
set(model --context-length 32 --model-width 16 --heads 2 --layers 2 --feed-forward-width 32 --sequence-length 16
          --steps 6 --eval-interval 3 --eval-batches 1 --checkpoint-interval 2)

function(expect_once out pattern what)
  string(REGEX MATCHALL "${pattern}" found "${out}")
  list(LENGTH found n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "${what}: '${pattern}' printed ${n} times (rank 0 alone prints):\n${out}")
  endif()
endfunction()

execute_process(COMMAND ${mpirun} ${RT_TRAIN} pretrain --data ${WORK}/corpus.txt ${model} --batch 4 --output ${WORK}/pre
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pretrain under mpirun -np 2 failed (${rc}):\n${out}\n${err}")
endif()
expect_once("${out}" "done: 6 steps" "pretrain")
expect_once("${err}" "data-parallel over 2 ranks \\(2 of 4 rows each\\)" "pretrain")
file(READ ${WORK}/pre/metadata.json meta)
string(JSON world GET "${meta}" world_size)
if(NOT world EQUAL 2)
  message(FATAL_ERROR "metadata.json records world_size ${world}, expected 2")
endif()
string(JSON kind GET "${meta}" facts communicator)
if(NOT kind STREQUAL "mpi")
  message(FATAL_ERROR "metadata.json records facts.communicator '${kind}', expected 'mpi'")
endif()

execute_process(COMMAND ${mpirun} ${RT_TRAIN} post-train --base-model ${WORK}/pre/model.safetensors
                        --data ${SOURCE_DIR}/data/chat_example.jsonl --steps 4 --batch 4 --sequence-length 32
                        --lora-rank 2 --eval-interval 2 --eval-batches 1 --output ${WORK}/lora
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "LoRA post-train under mpirun -np 2 failed (${rc}):\n${out}\n${err}")
endif()
expect_once("${out}" "done: 4 steps" "post-train")
if(NOT EXISTS ${WORK}/lora/adapter.safetensors)
  message(FATAL_ERROR "post-train wrote no adapter.safetensors:\n${out}")
endif()

# ZeRO-1 with 1 MiB buckets: the same weights as the plain run above, bit for bit.
execute_process(COMMAND ${mpirun} ${RT_TRAIN} pretrain --data ${WORK}/corpus.txt ${model} --batch 4 --zero 1
                        --bucket-mib 1 --output ${WORK}/zero
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pretrain --zero 1 under mpirun -np 2 failed (${rc}):\n${out}\n${err}")
endif()
expect_once("${out}" "done: 6 steps" "pretrain --zero 1")
expect_once("${err}" "data-parallel over 2 ranks \\(2 of 4 rows each, ZeRO-1\\)" "pretrain --zero 1")
file(READ ${WORK}/zero/metadata.json meta)
string(JSON zero GET "${meta}" config zero_stage)
string(JSON mib GET "${meta}" config gradient_bucket_mib)
if(NOT zero EQUAL 1 OR NOT mib EQUAL 1)
  message(FATAL_ERROR "metadata.json records zero_stage ${zero}, gradient_bucket_mib ${mib}; expected 1 and 1")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/pre/model.safetensors ${WORK}/zero/model.safetensors
                RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "--zero 1 --bucket-mib 1 trained other weights than --zero 0 --bucket-mib 25")
endif()
foreach(bad "--zero;2" "--bucket-mib;0")
  execute_process(COMMAND ${RT_TRAIN} pretrain --data ${WORK}/corpus.txt ${model} ${bad} --output ${WORK}/bad
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  list(GET bad 0 flag)
  if(NOT rc EQUAL 2 OR NOT "${err}" MATCHES "${flag}")
    message(FATAL_ERROR "${bad}: expected exit 2 naming ${flag}, got ${rc}:\n${out}\n${err}")
  endif()
endforeach()

execute_process(COMMAND ${mpirun} ${RT_TRAIN} pretrain --data ${WORK}/corpus.txt ${model} --batch 3 --output ${WORK}/uneven
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(rc EQUAL 0 OR NOT "${err}" MATCHES "batch 3 \\(rows per micro-batch, the global batch\\) is not divisible by the 2 ranks")
  message(FATAL_ERROR "batch 3 over 2 ranks: expected the ValueError (exit ${rc}):\n${out}\n${err}")
endif()
if(EXISTS ${WORK}/uneven)
  message(FATAL_ERROR "the refused run created its output directory")
endif()
# MPMD: the two ranks started with different --steps (this hung before the
# ranks compared their settings): refused on every rank within seconds.
set(mpmd pretrain --data ${WORK}/corpus.txt --context-length 32 --model-width 16 --heads 2 --layers 2
         --feed-forward-width 32 --sequence-length 16 --batch 4 --output ${WORK}/mpmd)
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 1 --oversubscribe ${RT_TRAIN} ${mpmd} --steps 5
                        : ${NP_FLAG} 1 ${RT_TRAIN} ${mpmd} --steps 6
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
if(rc EQUAL 0 OR rc MATCHES "timeout" OR NOT "${err}" MATCHES "different settings: 'steps' is 5 on rank 0 and 6 on rank 1")
  message(FATAL_ERROR "ranks with --steps 5 and 6: expected the ValueError on both (exit ${rc}):\n${out}\n${err}")
endif()
if(EXISTS ${WORK}/mpmd)
  message(FATAL_ERROR "the refused MPMD job created its output directory")
endif()
file(REMOVE_RECURSE ${WORK})
