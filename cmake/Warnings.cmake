option(PRISM_WERROR "Treat warnings as errors" OFF)
function(prism_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(PRISM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# prism_library(<name> [<library>...]): a static library of every *.cc in the current folder (re-globbed at build
# time, so a new file needs no CMake edit), linked with the third-party set (prism_deps) and the project libraries
# named, exactly those whose headers its files include (tests/include_rules.sh holds the allowed directions, and
# ctest Architecture.LinkRules checks these links against them).
function(prism_library name)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC prism_deps ${ARGN})
  prism_warnings(${name})
endfunction()
