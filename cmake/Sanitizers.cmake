# -DPRISM_SANITIZE=address,undefined builds everything with those sanitizers (not libprism.so's users).
set(PRISM_SANITIZE "" CACHE STRING "Comma-separated sanitizers (address, undefined, thread)")
if(PRISM_SANITIZE)
  add_compile_options(-fsanitize=${PRISM_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PRISM_SANITIZE})
endif()
