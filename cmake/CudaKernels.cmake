# Our own CUDA kernels: compiled by nvcc into a fatbin (sm_90 SASS + compute_90 PTX fallback) and embedded
# as a byte array in the library that loads them through the driver API (cuModuleLoadData).
# Why not enable_language(CUDA): the shim must not link libcudart; it only needs the fatbin bytes.
find_program(PRISM_NVCC nvcc HINTS ${PRISM_CUDA_ROOT}/bin)
set(PRISM_CUDA_ARCHS "90" CACHE STRING "SM architectures for own kernels (PTX of the last is embedded too)")

# prism_embed_fatbin(<target> <symbol> <file.cu>...) adds <symbol>.cc defining
#   extern "C" const unsigned char <symbol>[]; extern "C" const unsigned long <symbol>_size;
function(prism_embed_fatbin target symbol)
  if(NOT PRISM_NVCC)
    message(WARNING "nvcc not found: ${symbol} is embedded empty")
  endif()
  set(gencode "")
  foreach(a ${PRISM_CUDA_ARCHS})
    list(APPEND gencode "-gencode=arch=compute_${a},code=sm_${a}")
    set(last ${a})
  endforeach()
  list(APPEND gencode "-gencode=arch=compute_${last},code=compute_${last}")
  set(fatbin ${CMAKE_CURRENT_BINARY_DIR}/${symbol}.fatbin)
  set(out_cc ${CMAKE_CURRENT_BINARY_DIR}/${symbol}.cc)
  set(srcs "")
  set(unity "// Generated: one translation unit for all of ${symbol}'s kernels.\n")
  foreach(s ${ARGN})
    list(APPEND srcs ${CMAKE_CURRENT_SOURCE_DIR}/${s})
    string(APPEND unity "#include \"${CMAKE_CURRENT_SOURCE_DIR}/${s}\"\n")
  endforeach()
  # Why one unity file: nvcc --fatbin takes a single input file (and -rdc would drop the PTX fallback).
  set(unity_cu ${CMAKE_CURRENT_BINARY_DIR}/${symbol}_all.cu)
  file(CONFIGURE OUTPUT ${unity_cu} CONTENT "${unity}")
  if(PRISM_NVCC)
    add_custom_command(OUTPUT ${fatbin}
      COMMAND ${PRISM_NVCC} --fatbin -O3 ${gencode} -I${PROJECT_SOURCE_DIR}/src -o ${fatbin} ${unity_cu}
      DEPENDS ${srcs} COMMENT "nvcc fatbin ${symbol}" VERBATIM)
  else()
    add_custom_command(OUTPUT ${fatbin} COMMAND ${CMAKE_COMMAND} -E touch ${fatbin} VERBATIM)
  endif()
  add_custom_command(OUTPUT ${out_cc}
    COMMAND ${CMAKE_COMMAND} -DIN=${fatbin} -DOUT=${out_cc} -DSYM=${symbol}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedBinary.cmake
    DEPENDS ${fatbin} ${PROJECT_SOURCE_DIR}/cmake/EmbedBinary.cmake VERBATIM)
  target_sources(${target} PRIVATE ${out_cc})
endfunction()
