# Documentation that comes with the package, and the API reference.
#
# The examples are installed beside the documentation, with a CMakeLists.txt that builds them on
# their own against the installed package (tests/install/run.sh does).
install(DIRECTORY examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        FILES_MATCHING PATTERN "*.cpp" PATTERN "CMakeLists.txt")

# `cmake --build build --target docs` writes the API reference (HTML, one page per public header,
# the headers' comments as the text) to build/docs/api/html/index.html. Only when doxygen is
# found; never part of the default build or of the tests.
find_program(DOXYGEN_EXECUTABLE doxygen)
if(DOXYGEN_EXECUTABLE)
  set(REMAT_DOXYGEN_OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/docs/api)
  configure_file(${CMAKE_CURRENT_SOURCE_DIR}/docs/Doxyfile.in ${CMAKE_CURRENT_BINARY_DIR}/docs/Doxyfile @ONLY)
  file(GLOB_RECURSE REMAT_PUBLIC_HEADERS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/include/remat/*.h)
  add_custom_command(OUTPUT ${REMAT_DOXYGEN_OUTPUT}/html/index.html
                     COMMAND ${DOXYGEN_EXECUTABLE} ${CMAKE_CURRENT_BINARY_DIR}/docs/Doxyfile
                     DEPENDS ${REMAT_PUBLIC_HEADERS} ${CMAKE_CURRENT_SOURCE_DIR}/docs/Doxyfile.in
                             ${CMAKE_CURRENT_SOURCE_DIR}/docs/Doxyfile.filter
                     COMMENT "API reference (doxygen): ${REMAT_DOXYGEN_OUTPUT}/html/index.html"
                     VERBATIM)
  add_custom_target(docs DEPENDS ${REMAT_DOXYGEN_OUTPUT}/html/index.html)
endif()
