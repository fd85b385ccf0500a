// An offload store starts the OpenMP runtime before it maps its file (Note [offload files] in
// src/saved/offload_file.cpp). LLVM's OpenMP runtime, when it starts, may read an address named in
// a registration file that a killed process with the same pid left in /dev/shm; a read inside the
// store's mapping but past its file's end is a SIGBUS (a CI run of the ASan build died so, in
// PolicyForms.ConstructorsAndScopesFailWithTheMessagesTheyHad).
//
// This test builds that case on purpose: it plants a registration file for its own pid naming an
// address in the middle of where the store's mapping will go, then starts an offload policy. The
// test is alone in its executable, so nothing has started OpenMP before it.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "remat/policy.h"
#include "temp_dir.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(OffloadOpenMpStart, AStaleRegistrationNamingAnAddressInTheMapIsNeverRead) {
  namespace fs = std::filesystem;
  if (dlsym(RTLD_DEFAULT, "__kmpc_fork_call") == nullptr) GTEST_SKIP() << "not LLVM's OpenMP runtime";
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string registration =
      "/dev/shm/__KMP_REGISTERED_LIB_" + std::to_string(getpid()) + "_" + std::to_string(getuid());
  // Where a 1 TiB mapping goes now (the store's reserve, kMapBytes); the planted address is half
  // way into it, so a mapping placed a little lower or higher still holds it.
  constexpr size_t kReserve = size_t{1} << 40;
  void* probe = mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  munmap(probe, kReserve);
  std::ostringstream planted;
  planted << static_cast<void*>(static_cast<char*>(probe) + kReserve / 2) << "-cafe1234-libomp.so.5";
  {
    std::ofstream out(registration, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(out) << registration;
    out << planted.str() << std::string(1024 - planted.str().size(), '\0');
  }
  const std::string dir = remat::testing::fresh_dir("openmp-start");
  {
    remat::ScopedPolicy scope(remat::Policy::offload(dir));
  }
  fs::remove_all(dir);
  // The runtime started inside the scope (found the planted file, saw its process gone, replaced
  // it with its own); had it started before, the file would still hold what was planted.
  EXPECT_NE(read_all(registration).substr(0, planted.str().size()), planted.str())
      << "OpenMP had started before the policy: this test must be alone in its process";
}

}  // namespace
