# Third-party libraries, all from Debian packages (scripts/setup.sh installs them).
# Why header-only spdlog/fmt: binaries built here must run on the GPU machine (Ubuntu) where
# Debian's libspdlog.so/libfmt.so are absent, and libprism.so must not share their symbols with torch.
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)

add_library(prism_deps INTERFACE)
target_link_libraries(prism_deps INTERFACE spdlog::spdlog_header_only fmt::fmt-header-only
                      nlohmann_json::nlohmann_json Threads::Threads)
target_include_directories(prism_deps INTERFACE ${PROJECT_SOURCE_DIR}/include)

# CUDA headers for the shim and the calibrate measurer (cuda.h and nccl.h; CUPTI's where the toolkit has them,
# src/interpose/core/kernel_trace.cc); no CUDA library is linked.
# Why fail here: libprism.so, its unit tests and the measurer need them; CI and the GPU machine have the toolkit.
set(PRISM_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root (headers and nvcc)")
set(PRISM_CUDA_INCLUDE "${PRISM_CUDA_ROOT}/include")
foreach(h cuda.h nccl.h)
  if(NOT EXISTS "${PRISM_CUDA_INCLUDE}/${h}")
    message(FATAL_ERROR "${h} not found under ${PRISM_CUDA_INCLUDE}: install the CUDA toolkit (and NCCL's headers) "
                        "there or pass -DPRISM_CUDA_ROOT=DIR")
  endif()
endforeach()
