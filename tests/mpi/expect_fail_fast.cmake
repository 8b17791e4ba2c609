# Runs `MPIEXEC NP_FLAG 2 --oversubscribe PROGRAM ARGS` with a time limit; passes when it exits non-zero
# within LIMIT seconds and its output contains MESSAGE (a job that hangs or
# that succeeds fails this test).
string(TIMESTAMP start "%s")
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 2 --oversubscribe ${PROGRAM} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
message("exit: ${rc}; ${seconds} s\n--- stdout\n${out}\n--- stderr\n${err}")
if(rc MATCHES "timeout" OR seconds GREATER_EQUAL LIMIT)
  message(FATAL_ERROR "the job did not end within ${LIMIT} s (a hang)")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0; expected a non-zero exit")
endif()
# MESSAGE_OR: another message that also passes. When two ranks fail at once,
# the first MPI_Abort may kill the other before it prints.
string(FIND "${out}${err}" "${MESSAGE}" found)
if(found EQUAL -1 AND DEFINED MESSAGE_OR)
  string(FIND "${out}${err}" "${MESSAGE_OR}" found)
endif()
if(found EQUAL -1)
  message(FATAL_ERROR "the output does not contain: ${MESSAGE}${MESSAGE_OR}")
endif()
