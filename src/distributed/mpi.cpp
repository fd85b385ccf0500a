// remat::distributed over MPI (built when REMAT_WITH_MPI is on): start-up, the collectives.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <vector>

#include "async_sum.h"
#include "remat/distributed.h"
#include "remat/error.h"

namespace remat::distributed {

namespace {

bool started = false;  // MPI_Init_thread was called by init()

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(detail::concat("distributed: ", call, " failed on rank ", rank(), ": ", std::string(text, length)));
}

MPI_Datatype mpi_type(const Tensor& t) {
  if (t.dtype() == DType::f32) return MPI_FLOAT;
  if (t.dtype() == DType::f64) return MPI_DOUBLE;
  throw Error(detail::concat("distributed: all_reduce_sum supports f32 and f64 tensors, got ", dtype_name(t.dtype())));
}

// Elements per message: well inside MPI's int counts, and a pipeline of several chunks along the
// chain of the ordered reduction.
constexpr int64_t kChunkElements = int64_t{1} << 18;

template <class T>
void add_into(T* own, const T* partial, int64_t n) {
  // own = partial + own: the partial sum of the lower ranks is the left operand, as in a
  // sequential accumulation (acc + g)
  for (int64_t i = 0; i < n; ++i) own[i] = partial[i] + own[i];
}

void ordered_sum(const Tensor& t, MPI_Datatype type, int me, int world) {
  const int64_t n = t.numel();
  const size_t element = dtype_size(t.dtype());
  char* data = static_cast<char*>(t.raw_data());
  Tensor buffer;
  if (me > 0) buffer = Tensor::empty({std::min(n, kChunkElements)}, t.dtype());
  for (int64_t begin = 0; begin < n; begin += kChunkElements) {
    const int count = static_cast<int>(std::min(kChunkElements, n - begin));
    char* chunk = data + static_cast<size_t>(begin) * element;
    if (me > 0) {
      check_mpi(MPI_Recv(buffer.raw_data(), count, type, me - 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      if (type == MPI_FLOAT)
        add_into(reinterpret_cast<float*>(chunk), static_cast<const float*>(buffer.raw_data()), count);
      else
        add_into(reinterpret_cast<double*>(chunk), static_cast<const double*>(buffer.raw_data()), count);
    }
    if (me + 1 < world) check_mpi(MPI_Send(chunk, count, type, me + 1, 0, MPI_COMM_WORLD), "MPI_Send");
  }
  for (int64_t begin = 0; begin < n; begin += kChunkElements) {
    const int count = static_cast<int>(std::min(kChunkElements, n - begin));
    check_mpi(MPI_Bcast(data + static_cast<size_t>(begin) * element, count, type, world - 1, MPI_COMM_WORLD),
              "MPI_Bcast");
  }
}

}  // namespace

bool available() { return true; }

bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void init() {
  if (started || !launched()) return;
  int already = 0;
  check_mpi(MPI_Initialized(&already), "MPI_Initialized");
  if (!already) {
    int provided = 0;
    // only the calling thread talks to MPI (OpenMP workers never do)
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  started = true;
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
}

void finalize() {
  if (!started) return;
  started = false;
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

void abort(int code) {
  if (!started) return;
  MPI_Abort(MPI_COMM_WORLD, code);
}

bool initialized() { return started; }

int rank() {
  if (!started) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  if (!started) return 1;
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void all_reduce_sum(const std::vector<Tensor>& tensors, Reduction mode) {
  for (const Tensor& t : tensors) {
    REMAT_CHECK(t.defined() && t.is_contiguous(), "distributed: all_reduce_sum needs defined, contiguous tensors");
    mpi_type(t);
  }
  const int world = world_size();
  if (world == 1) return;
  const int me = rank();
  for (const Tensor& t : tensors) {
    MPI_Datatype type = mpi_type(t);
    if (mode == Reduction::ordered) {
      ordered_sum(t, type, me, world);
      continue;
    }
    const int64_t n = t.numel();
    char* data = static_cast<char*>(t.raw_data());
    for (int64_t begin = 0; begin < n; begin += kChunkElements) {
      const int count = static_cast<int>(std::min(kChunkElements, n - begin));
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, data + static_cast<size_t>(begin) * dtype_size(t.dtype()), count, type,
                              MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
    }
  }
}

void broadcast(const std::vector<Tensor>& tensors, int root) {
  if (world_size() == 1) return;
  constexpr size_t kChunkBytes = size_t{1} << 26;
  for (const Tensor& t : tensors) {
    REMAT_CHECK(t.defined() && t.is_contiguous(), "distributed: broadcast needs defined, contiguous tensors");
    char* data = static_cast<char*>(t.raw_data());
    const size_t n = t.nbytes();
    for (size_t begin = 0; begin < n; begin += kChunkBytes) {
      const int count = static_cast<int>(std::min(kChunkBytes, n - begin));
      check_mpi(MPI_Bcast(data + begin, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }
}

std::vector<double> all_gather(double v) {
  std::vector<double> all(static_cast<size_t>(world_size()), v);
  if (all.size() > 1)
    check_mpi(MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD), "MPI_Allgather");
  return all;
}

std::vector<uint64_t> all_gather(uint64_t v) {
  std::vector<uint64_t> all(static_cast<size_t>(world_size()), v);
  if (all.size() > 1)
    check_mpi(MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  return all;
}

// ---- the non-blocking sum of GradientBuckets

namespace internal {

namespace {

// Elements per non-blocking collective: MPI's counts are ints; a bucket larger than this (one
// huge parameter) is reduced as several collectives started together.
constexpr int64_t kAsyncChunkElements = int64_t{1} << 24;

class MpiSum final : public AsyncSum {
 public:
  MpiSum(const Tensor& flat, const Tensor& gathered, Reduction mode)
      : flat_(flat), gathered_(gathered), mode_(mode), world_(world_size()) {
    const MPI_Datatype type = mpi_type(flat);
    const int64_t n = flat.numel();
    const size_t element = dtype_size(flat.dtype());
    char* data = static_cast<char*>(flat.raw_data());
    for (int64_t begin = 0; begin < n; begin += kAsyncChunkElements) {
      const int count = static_cast<int>(std::min(kAsyncChunkElements, n - begin));
      MPI_Request request = MPI_REQUEST_NULL;
      if (mode == Reduction::native) {
        check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + static_cast<size_t>(begin) * element, count, type, MPI_SUM,
                                 MPI_COMM_WORLD, &request),
                  "MPI_Iallreduce");
      } else {
        REMAT_CHECK(gathered.defined() && gathered.numel() == n * world_, "distributed: the gathered buffer of a bucket has ",
                    gathered.defined() ? gathered.numel() : 0, " elements, expected ", n * world_);
        // chunk c of every rank lands at [world x chunk] starting at world * begin
        char* into = static_cast<char*>(gathered.raw_data()) + static_cast<size_t>(begin * world_) * element;
        check_mpi(MPI_Iallgather(data + static_cast<size_t>(begin) * element, count, type, into, count, type,
                                 MPI_COMM_WORLD, &request),
                  "MPI_Iallgather");
      }
      requests_.push_back(request);
    }
  }
  ~MpiSum() override {
    // never leave a collective behind (an error unwinding the step): complete it, ignoring errors
    if (!done_ && !requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (flag) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    complete();
  }

 private:
  template <class T>
  void fold() {
    // flat = g0 + g1 + ... + g(N-1), left to right: the partial sum of the lower ranks is the left
    // operand, as in ordered_sum's chain and in a sequential accumulation
    T* out = static_cast<T*>(flat_.raw_data());
    const T* all = static_cast<const T*>(gathered_.raw_data());
    const int64_t n = flat_.numel();
    for (int64_t begin = 0; begin < n; begin += kAsyncChunkElements) {
      const int64_t count = std::min(kAsyncChunkElements, n - begin);
      const T* chunk = all + begin * world_;
      for (int64_t i = 0; i < count; ++i) {
        T acc = chunk[i];
        for (int r = 1; r < world_; ++r) acc = acc + chunk[static_cast<int64_t>(r) * count + i];
        out[begin + i] = acc;
      }
    }
  }
  void complete() {
    done_ = true;
    requests_.clear();
    if (mode_ != Reduction::ordered) return;
    if (flat_.dtype() == DType::f32) fold<float>();
    else fold<double>();
  }

  Tensor flat_, gathered_;
  Reduction mode_;
  int world_;
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

// One rank (MPI not started, or a world of one): the sum is the bucket itself, complete at once.
class OneRank final : public AsyncSum {
 public:
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<AsyncSum> start_sum(const Tensor& flat, const Tensor& gathered, Reduction mode) {
  REMAT_CHECK(flat.defined() && flat.is_contiguous() && flat.dim() == 1,
              "distributed: a bucket must be a contiguous 1-D tensor");
  if (world_size() == 1) return std::make_unique<OneRank>();
  return std::make_unique<MpiSum>(flat, gathered, mode);
}

}  // namespace internal

}  // namespace remat::distributed
