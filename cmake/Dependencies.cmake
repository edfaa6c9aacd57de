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

# CUDA headers (cuda.h, nccl.h, cupti.h) for the shim; no CUDA library is linked.
set(PRISM_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root (headers and nvcc)")
set(PRISM_CUDA_INCLUDE "${PRISM_CUDA_ROOT}/include")
if(EXISTS "${PRISM_CUDA_INCLUDE}/cuda.h" AND EXISTS "${PRISM_CUDA_INCLUDE}/nccl.h")
  set(PRISM_HAVE_CUDA_HEADERS ON)
else()
  set(PRISM_HAVE_CUDA_HEADERS OFF)
  message(WARNING "CUDA headers not found under ${PRISM_CUDA_INCLUDE}: libprism.so is not built")
endif()
