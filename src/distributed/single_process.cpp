// remat::distributed without MPI (REMAT_WITH_MPI=OFF): one rank, collectives leave their
// arguments as they are; a process started by mpirun is told this build cannot take part.
#include <cstdlib>

#include "async_sum.h"
#include "remat/distributed.h"
#include "remat/error.h"

namespace remat::distributed {

bool available() { return false; }

bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void init() {
  REMAT_CHECK(!launched(), "distributed: this process was started by an MPI launcher, but remat was built without "
              "MPI (configure with -DREMAT_WITH_MPI=ON and an MPI library installed)");
}
void finalize() {}
void abort(int) {}
bool initialized() { return false; }
int rank() { return 0; }
int world_size() { return 1; }

void all_reduce_sum(const std::vector<Tensor>& tensors, Reduction) {
  for (const Tensor& t : tensors)
    REMAT_CHECK(t.defined() && t.is_contiguous(), "distributed: all_reduce_sum needs defined, contiguous tensors");
}
void broadcast(const std::vector<Tensor>&, int) {}
std::vector<double> all_gather(double v) { return {v}; }
std::vector<uint64_t> all_gather(uint64_t v) { return {v}; }

namespace internal {
namespace {
class Done final : public AsyncSum {  // one rank: the sum is this rank's pieces, in the tree's order
 public:
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace
std::unique_ptr<AsyncSum> start_sum(const std::vector<Tensor>& pieces, const Tensor&, const SumLayout& layout,
                                    Reduction) {
  REMAT_CHECK(!pieces.empty() && layout.blocks.size() == 1 && pieces.size() == layout.blocks[0].size(),
              "distributed: a sum needs one piece per block of this rank (", pieces.size(), " given)");
  TreeStack<Tensor> stack;
  for (size_t j = 0; j < pieces.size(); ++j) stack.push(layout.blocks[0][j], pieces[j], add_into);
  stack.fold(add_into);
  return std::make_unique<Done>();
}
std::vector<double> all_gather_values(const std::vector<double>& values) { return values; }
}  // namespace internal

}  // namespace remat::distributed
