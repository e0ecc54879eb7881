# ctest driver: install tinylm from the build tree into a scratch prefix, then
# configure, build and run the consumer project against that installation.
# -D BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, and CXX_FLAGS / LINKER_FLAGS: the flags
# tinylm was built with (a sanitizer build's consumer must be instrumented the same way);
# LAUNCHER: tinylm's compiler launcher (ccache in CI), used for the consumer too
file(REMOVE_RECURSE "${WORK_DIR}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: step failed (${rc}): ${ARGN}")
  endif()
endfunction()
step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
     "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}"
     "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
# The library example (main.cpp, which docs/library.md links), run from outside the source
# tree: it trains its own model on its own task to the stated target, saves, reloads and
# evaluates.
execute_process(COMMAND "${WORK_DIR}/build/consumer" run WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "accuracy 100.0% on new batches")
  message(FATAL_ERROR "consumer test: the example failed (${rc})")
endif()
# Bad input ends in an exception the example catches: one line, exit 1, no terminate.
function(expect_refusal what expected)
  execute_process(COMMAND "${WORK_DIR}/build/consumer" ${ARGN} WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 1 OR NOT err MATCHES "^error: [^\n]*${expected}" OR err MATCHES "terminate")
    message(FATAL_ERROR "consumer test: ${what}: expected exit 1 and 'error: ...${expected}', got ${rc}: ${err}")
  endif()
  message("ok: ${what}: ${err}")
endfunction()
expect_refusal("zero steps" "steps_per_epoch must be >= 1, got 0" fresh 0)
expect_refusal("steps not a number" "STEPS must be a whole number, got 'many'" fresh2 many)
expect_refusal("an earlier run's directory" "already holds a run" run)
