// The ordered gradient sum (remat::distributed, Note [the ordered reduction] in src/distributed/mpi.cpp)
// against MPI_Allreduce (--reduce native), side by side in one run, under mpirun:
//   mpirun -np N bench_reduce [ELEMENTS] [REPEATS]
// ELEMENTS float32 values a rank (default 414976: the default `remat train` GPT's parameters on the
// default corpus), summed as one buffer and as 1 MiB buckets (as the training loop's), REPEATS
// times each (default 40), ordered and native in turns; prints on rank 0 the median and the fastest
// time of each and their ratios (on a loaded machine the fastest is the steadier figure). Checks first that the ordered sum has the bits of the micro-batch tree over the
// ranks' values, computed locally.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "remat/distributed.h"
#include "remat/tensor.h"

using namespace remat;
namespace dist = remat::distributed;

namespace {

float value(int rank, int64_t i) { return static_cast<float>((rank * 7919 + i * 31) % 1009) * 0.001f - 0.5f; }

// The tree over the ranks (pairs of aligned blocks, then the rest, largest first), computed here.
float tree_sum(int world, int64_t i) {
  std::vector<std::pair<int, float>> stack;  // (block size, partial sum)
  for (int r = 0; r < world; ++r) {
    stack.push_back({1, value(r, i)});
    while (stack.size() >= 2 && stack[stack.size() - 2].first == stack.back().first) {
      const float right = stack.back().second;
      stack.pop_back();
      stack.back().second = stack.back().second + right;
      stack.back().first *= 2;
    }
  }
  float total = stack.front().second;
  for (size_t k = 1; k < stack.size(); ++k) total = total + stack[k].second;
  return total;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  dist::init();
  const int me = dist::rank(), world = dist::world_size();
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 414976;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 40;
  Tensor buffer = Tensor::empty({n}, DType::f32);
  auto fill = [&] {
    float* p = buffer.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = value(me, i);
  };
  fill();
  dist::all_reduce_sum({buffer}, dist::Reduction::ordered);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float expected = tree_sum(world, i);
    if (std::memcmp(&buffer.data<float>()[i], &expected, sizeof(float)) != 0) ++wrong;
  }
  if (wrong != 0) {
    std::fprintf(stderr, "bench_reduce: rank %d: %lld elements differ from the tree's sum\n", me, static_cast<long long>(wrong));
    dist::abort(1);
    return 1;
  }
  const int64_t bucket = (int64_t{1} << 20) / 4;
  std::vector<Tensor> buckets;
  for (int64_t b = 0; b < n; b += bucket) buckets.push_back(buffer.slice(0, b, std::min(n, b + bucket)).contiguous());
  struct Times {
    std::vector<double> whole, bucketed;
  } ordered, native;
  auto timed = [&](const std::vector<Tensor>& tensors, dist::Reduction mode) {
    dist::all_gather(0.0);  // every rank starts together
    const auto t0 = std::chrono::steady_clock::now();
    dist::all_reduce_sum(tensors, mode);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return dist::all_gather(s)[0];  // rank 0's
  };
  for (int r = 0; r < repeats; ++r) {
    fill();
    ordered.whole.push_back(timed({buffer}, dist::Reduction::ordered));
    fill();
    native.whole.push_back(timed({buffer}, dist::Reduction::native));
    ordered.bucketed.push_back(timed(buckets, dist::Reduction::ordered));
    native.bucketed.push_back(timed(buckets, dist::Reduction::native));
  }
  if (me == 0) {
    std::printf("%d ranks, %lld float32 a rank (%.2f MB), %d repeats (median / fastest):\n", world,
                static_cast<long long>(n), 4.0 * static_cast<double>(n) / 1e6, repeats);
    auto line = [](const char* what, const std::vector<double>& o, const std::vector<double>& m) {
      std::printf("  %-15s ordered %.3f / %.3f ms, MPI_Allreduce %.3f / %.3f ms, ratio %.2f / %.2f\n", what,
                  1e3 * median(o), 1e3 * least(o), 1e3 * median(m), 1e3 * least(m), median(o) / median(m),
                  least(o) / least(m));
    };
    line("one buffer:", ordered.whole, native.whole);
    line("1 MiB buckets:", ordered.bucketed, native.bucketed);
  }
  dist::finalize();
  return 0;
}
