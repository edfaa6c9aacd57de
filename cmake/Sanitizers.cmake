# -DPRISM_SANITIZE=address,undefined builds everything with those sanitizers (not libprism.so's users).
set(PRISM_SANITIZE "" CACHE STRING "Comma-separated sanitizers (address, undefined, thread)")
if(PRISM_SANITIZE)
  # Why no recovery: a sanitizer report must fail the test that caused it, not scroll past in its output.
  add_compile_options(-fsanitize=${PRISM_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PRISM_SANITIZE} -fno-sanitize-recover=all)
endif()
