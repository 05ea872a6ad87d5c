# Runs `kiln tokenize` and `kiln detokenize` on the hand-written reference cases of one tokenizer (the first
# 60; the random documents after them are left to kiln_tokenizer_tests) and compares their output with what
# Hugging Face tokenizers gave (tests/data/tokenizers/<name>.ref.json).
#   cmake -DKILN=path/to/kiln -DTOKENIZER=.../name.json -DREFERENCE=.../name.ref.json -P cli_tokenizer_check.cmake
file(READ "${REFERENCE}" ref)
string(JSON cases GET "${ref}" encode)
string(JSON n LENGTH "${cases}")
if(n GREATER 60)
  set(n 60)
endif()
math(EXPR last "${n} - 1")
set(failures 0)
foreach(i RANGE ${last})
  string(JSON c GET "${cases}" ${i})
  string(JSON text GET "${c}" text)
  string(JSON ids GET "${c}" ids)
  string(JSON decoded GET "${c}" decoded)
  # [1,2,3] -> 1,2,3
  string(REGEX REPLACE "[][ \n]" "" ids_csv "${ids}")
  execute_process(COMMAND "${KILN}" tokenize --tokenizer "${TOKENIZER}" -- "${text}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out STREQUAL "${ids_csv}\n")
    math(EXPR failures "${failures} + 1")
    message(SEND_ERROR "tokenize case ${i}: expected '${ids_csv}', got '${out}' (exit ${rc}: ${err})")
  endif()
  execute_process(COMMAND "${KILN}" detokenize --tokenizer "${TOKENIZER}" -- "${ids_csv}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  # execute_process turns \r\n of the output into \n: compare those cases after the same translation.
  string(REPLACE "\r\n" "\n" decoded "${decoded}")
  if(NOT rc EQUAL 0 OR NOT out STREQUAL "${decoded}\n")
    math(EXPR failures "${failures} + 1")
    message(SEND_ERROR "detokenize case ${i}: expected '${decoded}', got '${out}' (exit ${rc}: ${err})")
  endif()
endforeach()
# A malformed id list and an unknown id are errors with a message, not output.
execute_process(COMMAND "${KILN}" detokenize --tokenizer "${TOKENIZER}" -- "1,x"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "is not a token id")
  message(SEND_ERROR "detokenize 1,x: expected an error, got exit ${rc}, '${out}', '${err}'")
endif()
execute_process(COMMAND "${KILN}" detokenize --tokenizer "${TOKENIZER}" -- "999999999"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "in no vocabulary")
  message(SEND_ERROR "detokenize 999999999: expected an error, got exit ${rc}, '${out}', '${err}'")
endif()
message(STATUS "${n} cases checked, ${failures} failures")
