# The CUDA backend (src/tensor/cuda). Included by the top-level CMakeLists.txt once the remat
# target exists. REMAT_WITH_CUDA defaults to ON where CMake finds nvcc and OFF elsewhere; OFF
# builds exactly what a machine without CUDA builds. The backend links the CUDA runtime (shared),
# cuBLAS, cuBLASLt and cuDNN privately; the runtime loads the driver (libcuda) itself when a
# device is first asked for, so the library loads and runs on the CPU where no driver is installed.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_remat_cuda_default ON)
else()
  set(_remat_cuda_default OFF)
endif()
option(REMAT_WITH_CUDA "Build the CUDA backend (src/tensor/cuda)" ${_remat_cuda_default})

if(REMAT_WITH_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # H100 / H200
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  enable_language(CUDA)
  # C++20 as for the rest of the library (CMake before 3.26 does not know nvcc's C++20 flag)
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set_target_properties(remat PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
  find_library(REMAT_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(REMAT_CUDNN_INCLUDE_DIR NAMES cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)

  # The options given to remat so far are the host compiler's: keep them to C++ sources and
  # pass nvcc its own (the host part of a .cu file still gets the warnings and the prefix map).
  get_target_property(_remat_options remat COMPILE_OPTIONS)
  set(_remat_cxx_options "")
  foreach(_option IN LISTS _remat_options)
    list(APPEND _remat_cxx_options "$<$<COMPILE_LANGUAGE:CXX>:${_option}>")
  endforeach()
  set_property(TARGET remat PROPERTY COMPILE_OPTIONS "${_remat_cxx_options}")
  target_compile_options(remat PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fmacro-prefix-map=${CMAKE_CURRENT_SOURCE_DIR}/=,-Wall,-Wno-unused-parameter,-fno-trapping-math>"
    "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>")

  file(GLOB REMAT_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/tensor/cuda/*.cu
       ${CMAKE_CURRENT_SOURCE_DIR}/src/tensor/cuda/*.cpp)
  target_sources(remat PRIVATE ${REMAT_CUDA_SOURCES})
  # PUBLIC: the command line and the tests know whether the backend is compiled in.
  target_compile_definitions(remat PUBLIC REMAT_WITH_CUDA=1)
  target_include_directories(remat PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${REMAT_CUDNN_INCLUDE_DIR})
  target_link_libraries(remat PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt ${REMAT_CUDNN_LIBRARY})
  # target properties that CMake would have set from the variables had CUDA been enabled first
  set_target_properties(remat PROPERTIES CUDA_RUNTIME_LIBRARY Shared CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                                         CUDA_COMPILER_LAUNCHER "${CMAKE_CUDA_COMPILER_LAUNCHER}")
  message(STATUS "remat: CUDA backend for sm_${CMAKE_CUDA_ARCHITECTURES} with CUDA ${CUDAToolkit_VERSION} (REMAT_WITH_CUDA=ON)")
else()
  message(STATUS "remat: built without the CUDA backend (REMAT_WITH_CUDA=OFF)")
endif()
