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
  // one piece per rank: the tree over the ranks (Note [the micro-batch tree] with one micro-batch each)
  const internal::SumLayout layout = internal::layout_of(1, world);
  for (const Tensor& t : tensors) {
    const Tensor flat = t.reshape({t.numel()});
    const Tensor scratch = mode == Reduction::ordered
                               ? Tensor::empty({internal::scratch_elements(t.numel(), layout)}, t.dtype())
                               : Tensor();
    internal::start_sum({flat}, scratch, layout, mode)->wait();
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

std::vector<double> internal::all_gather_values(const std::vector<double>& values) {
  const int world = world_size();
  if (world == 1) return values;
  std::vector<double> all(values.size() * static_cast<size_t>(world));
  check_mpi(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, all.data(),
                          static_cast<int>(values.size()), MPI_DOUBLE, MPI_COMM_WORLD),
            "MPI_Allgather");
  return all;
}

// ---- the non-blocking sum
//
// Note [the ordered reduction]. A reduce-scatter and an all-gather of point-to-point messages,
// which move what a ring all-reduce moves (2 (N - 1) / N of the data per rank when every rank holds
// one piece), in an order that never depends on the number of ranks or on message sizes. When N is
// a power of two and every rank holds one block, the tree's pairs are pairs of ranks and recursive
// halving and doubling make it in log2 N rounds (HalvingChunk); otherwise:
//   1. the elements are split into N slices; slice s of each of a rank's pieces goes to rank s;
//   2. rank s adds, slice s only, every rank's pieces in the micro-batch tree's order (TreeStack
//      over the blocks of all ranks, rank after rank: the blocks are consecutive), so every element
//      gets the additions a single process accumulating the whole step makes;
//   3. each rank sends its summed slice to every other.
// A phase's messages are tagged with the sum's sequence number (every rank starts the same sums in
// the same order) and its phase, so sums in flight at once (the buckets) never take each other's
// messages. OpenMPI progresses them inside MPI calls only: test() is that call. Sums larger than
// kChunkElements run as several sums (MPI counts are ints, and the chunks pipeline). Two ranks
// holding one block each need one addition per element, left + right = right + left: that sum is
// MPI_Iallreduce's, whatever its algorithm (measured faster over shared memory).

namespace internal {

namespace {

constexpr int64_t kChunkElements = int64_t{1} << 24;

uint64_t next_sequence() {
  static uint64_t sequence = 0;
  return sequence++;
}

template <class T>
void add_span(T* left, const T* right, int64_t n) {
  for (int64_t i = 0; i < n; ++i) left[i] = left[i] + right[i];
}

// One chunk of an ordered sum in flight.
class Chunk {
 public:
  virtual ~Chunk() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// Steps 1 to 3 of Note [the ordered reduction] for the elements [begin, begin + n) of the pieces.
class OrderedChunk final : public Chunk {
 public:
  OrderedChunk(const std::vector<Tensor>& pieces, char* scratch, const SumLayout& layout, int64_t begin, int64_t n)
      : pieces_(pieces), scratch_(scratch), layout_(layout), begin_(begin), n_(n), me_(rank()),
        world_(static_cast<int>(layout.blocks.size())), type_(mpi_type(pieces.front())),
        element_(dtype_size(pieces.front().dtype())), tag_(static_cast<int>(next_sequence() % 8192) * 2) {
    const Range mine = shard(n_, me_, world_);
    mine_ = mine.end - mine.begin;
    int64_t slot = 0;
    for (int r = 0; r < world_; ++r) {
      for (size_t j = 0; j < layout_.blocks[static_cast<size_t>(r)].size(); ++j, ++slot) {
        char* into = scratch_ + static_cast<size_t>(slot * mine_) * element_;
        if (r == me_) {
          std::memcpy(into, at(pieces_[j], mine.begin), static_cast<size_t>(mine_) * element_);
        } else if (mine_ > 0) {
          post(MPI_Irecv(into, static_cast<int>(mine_), type_, r, tag_, MPI_COMM_WORLD, &request()), "MPI_Irecv");
        }
      }
      if (r == me_) continue;
      const Range theirs = shard(n_, r, world_);
      if (theirs.end == theirs.begin) continue;
      for (const Tensor& piece : pieces_)
        post(MPI_Isend(at(piece, theirs.begin), static_cast<int>(theirs.end - theirs.begin), type_, r, tag_,
                       MPI_COMM_WORLD, &request()),
             "MPI_Isend");
    }
  }
  ~OrderedChunk() override {
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  bool test() override {
    if (phase_ == 3) return true;
    int flag = 1;
    if (!requests_.empty())
      check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE),
                "MPI_Testall");
    if (flag) advance();
    return phase_ == 3;
  }
  void wait() override {
    while (phase_ != 3) {
      if (!requests_.empty())
        check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      advance();
    }
  }

 private:
  MPI_Request& request() {
    requests_.push_back(MPI_REQUEST_NULL);
    return requests_.back();
  }
  void post(int rc, const char* call) { check_mpi(rc, call); }
  char* at(const Tensor& piece, int64_t offset) const {
    return static_cast<char*>(piece.raw_data()) + static_cast<size_t>(begin_ + offset) * element_;
  }
  void advance() {
    requests_.clear();
    if (phase_ == 1) {
      combine();
      send_slices();
      phase_ = 2;
    } else {
      phase_ = 3;
    }
  }
  // step 2: this rank's slice of every piece, added in the tree's order, into pieces[0]
  void combine() {
    const Range mine = shard(n_, me_, world_);
    TreeStack<char*> stack;
    int64_t slot = 0;
    auto add = [&](char*& left, char* const& right) {
      if (type_ == MPI_FLOAT) add_span(reinterpret_cast<float*>(left), reinterpret_cast<const float*>(right), mine_);
      else add_span(reinterpret_cast<double*>(left), reinterpret_cast<const double*>(right), mine_);
    };
    for (const auto& blocks : layout_.blocks)
      for (const Block& b : blocks) stack.push(b, scratch_ + static_cast<size_t>(slot++ * mine_) * element_, add);
    char* total = stack.fold(add);
    std::memcpy(at(pieces_[0], mine.begin), total, static_cast<size_t>(mine_) * element_);
  }
  // step 3
  void send_slices() {
    const Range mine = shard(n_, me_, world_);
    for (int r = 0; r < world_; ++r) {
      if (r == me_) continue;
      const Range theirs = shard(n_, r, world_);
      if (theirs.end > theirs.begin)
        post(MPI_Irecv(at(pieces_[0], theirs.begin), static_cast<int>(theirs.end - theirs.begin), type_, r, tag_ + 1,
                       MPI_COMM_WORLD, &request()),
             "MPI_Irecv");
      if (mine_ > 0)
        post(MPI_Isend(at(pieces_[0], mine.begin), static_cast<int>(mine_), type_, r, tag_ + 1, MPI_COMM_WORLD,
                       &request()),
             "MPI_Isend");
    }
  }

  std::vector<Tensor> pieces_;
  char* scratch_;
  const SumLayout& layout_;
  int64_t begin_, n_, mine_ = 0;
  int me_, world_;
  MPI_Datatype type_;
  size_t element_;
  int tag_;
  int phase_ = 1;
  std::vector<MPI_Request> requests_;
};

// A power-of-two number of ranks holding one block each: recursive halving, then doubling. In
// round k rank r and its partner r xor 2^k each keep one half of the elements still theirs and
// add the partner's partial sum of that half, the lower ranks' on the left: the pairs are the
// tree's nodes, level by level, so the sums are the tree's; then the halves travel back the same
// way. log2 N rounds of one message each way, the volume of a ring (Note [the ordered reduction]).
class HalvingChunk final : public Chunk {
 public:
  HalvingChunk(const Tensor& piece, char* scratch, int64_t begin, int64_t n)
      : piece_(piece), scratch_(scratch), me_(rank()), world_(world_size()), type_(mpi_type(piece)),
        element_(dtype_size(piece.dtype())), tag_(static_cast<int>(next_sequence() % 8192) * 2) {
    ranges_.push_back({begin, begin + n});
    for (int bit = 1; bit < world_; bit *= 2) ++rounds_;
    start_round();
  }
  ~HalvingChunk() override {
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  bool test() override {
    while (!done()) {
      int flag = 1;
      if (!requests_.empty())
        check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE),
                  "MPI_Testall");
      if (!flag) return false;
      finish_round();
    }
    return true;
  }
  void wait() override {
    while (!done()) {
      if (!requests_.empty())
        check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      finish_round();
    }
  }

 private:
  struct Span {
    int64_t begin, end;
  };
  bool done() const { return step_ == 2 * rounds_; }
  bool halving() const { return step_ < rounds_; }
  int round() const { return halving() ? step_ : 2 * rounds_ - 1 - step_; }  // the bit: 0, 1, .. then back
  bool lower() const { return ((me_ >> round()) & 1) == 0; }
  char* at(int64_t element) const { return static_cast<char*>(piece_.raw_data()) + static_cast<size_t>(element) * element_; }
  // the two halves of the range that round `k` splits
  std::pair<Span, Span> halves(int k) const {
    const Span whole = ranges_[static_cast<size_t>(k)];
    const int64_t mid = whole.begin + (whole.end - whole.begin) / 2;
    return {{whole.begin, mid}, {mid, whole.end}};
  }
  void exchange(Span send, char* into, int64_t receive) {
    const int partner = me_ ^ (1 << round());
    const int tag = tag_ + (halving() ? 0 : 1);
    requests_.assign(2, MPI_REQUEST_NULL);
    check_mpi(MPI_Irecv(into, static_cast<int>(receive), type_, partner, tag, MPI_COMM_WORLD, &requests_[0]), "MPI_Irecv");
    check_mpi(MPI_Isend(at(send.begin), static_cast<int>(send.end - send.begin), type_, partner, tag, MPI_COMM_WORLD,
                        &requests_[1]),
              "MPI_Isend");
  }
  void start_round() {
    if (done()) return;
    const auto [low, high] = halves(round());
    const Span keep = lower() ? low : high, give = lower() ? high : low;
    if (halving()) exchange(give, scratch_, keep.end - keep.begin);  // their partial sum of my half
    else exchange(keep, at(give.begin), give.end - give.begin);      // my summed half; theirs into place
  }
  void finish_round() {
    requests_.clear();
    if (halving()) {
      const auto [low, high] = halves(round());
      const Span keep = lower() ? low : high;
      const int64_t n = keep.end - keep.begin;
      if (type_ == MPI_FLOAT) add_ordered(reinterpret_cast<float*>(at(keep.begin)), reinterpret_cast<const float*>(scratch_), n);
      else add_ordered(reinterpret_cast<double*>(at(keep.begin)), reinterpret_cast<const double*>(scratch_), n);
      ranges_.push_back(keep);
    }
    ++step_;
    start_round();
  }
  // mine = lower ranks' + upper ranks' partial sums
  template <class T>
  void add_ordered(T* mine, const T* theirs, int64_t n) const {
    if (lower()) for (int64_t i = 0; i < n; ++i) mine[i] = mine[i] + theirs[i];
    else for (int64_t i = 0; i < n; ++i) mine[i] = theirs[i] + mine[i];
  }

  Tensor piece_;
  char* scratch_;
  int me_, world_;
  MPI_Datatype type_;
  size_t element_;
  int tag_;
  int rounds_ = 0, step_ = 0;
  std::vector<Span> ranges_;  // the range each round splits, then the last one kept
  std::vector<MPI_Request> requests_;
};

class OrderedSum final : public AsyncSum {
 public:
  OrderedSum(const std::vector<Tensor>& pieces, const Tensor& scratch, const SumLayout& layout) : layout_(layout) {
    REMAT_CHECK(scratch.defined() && scratch.dtype() == pieces.front().dtype() &&
                    scratch.numel() >= scratch_elements(pieces.front().numel(), layout_),
                "distributed: the scratch of an ordered sum is too small");
    const int64_t n = pieces.front().numel();
    const int world = static_cast<int>(layout_.blocks.size());
    const size_t element = dtype_size(scratch.dtype());
    char* at = static_cast<char*>(scratch.raw_data());
    // a power of two ranks of one block each: the tree's pairs are rank pairs (HalvingChunk)
    const bool pairs = (world & (world - 1)) == 0 && layout_.total_blocks() == world;
    for (int64_t begin = 0; begin < n; begin += kChunkElements) {
      const int64_t count = std::min(kChunkElements, n - begin);
      if (pairs) chunks_.push_back(std::make_unique<HalvingChunk>(pieces.front(), at, begin, count));
      else chunks_.push_back(std::make_unique<OrderedChunk>(pieces, at, layout_, begin, count));
      at += static_cast<size_t>(layout_.total_blocks() * ((count + world - 1) / world)) * element;
    }
  }
  bool test() override {
    bool all = true;
    for (auto& c : chunks_) all = c->test() && all;
    return all;
  }
  void wait() override {
    for (auto& c : chunks_) c->wait();
  }

 private:
  SumLayout layout_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
};

// MPI_Iallreduce of this rank's pieces added in order (the library's summation order over ranks).
class NativeSum final : public AsyncSum {
 public:
  explicit NativeSum(const std::vector<Tensor>& pieces) : flat_(pieces.front()) {
    for (size_t j = 1; j < pieces.size(); ++j) add_into(flat_, pieces[j]);
    const MPI_Datatype type = mpi_type(flat_);
    const int64_t n = flat_.numel();
    char* data = static_cast<char*>(flat_.raw_data());
    for (int64_t begin = 0; begin < n; begin += kChunkElements) {
      const int count = static_cast<int>(std::min(kChunkElements, n - begin));
      requests_.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + static_cast<size_t>(begin) * dtype_size(flat_.dtype()), count, type,
                               MPI_SUM, MPI_COMM_WORLD, &requests_.back()),
                "MPI_Iallreduce");
    }
  }
  ~NativeSum() override {
    if (!done_ && !requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    done_ = flag != 0;
    return done_;
  }
  void wait() override {
    if (done_) return;
    check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    done_ = true;
  }

 private:
  Tensor flat_;
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

// One rank: the sum is this rank's pieces in the tree's order, complete at once.
class OneRank final : public AsyncSum {
 public:
  OneRank(const std::vector<Tensor>& pieces, const SumLayout& layout) {
    TreeStack<Tensor> stack;
    for (size_t j = 0; j < pieces.size(); ++j) stack.push(layout.blocks[0][j], pieces[j], add_into);
    stack.fold(add_into);
  }
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<AsyncSum> start_sum(const std::vector<Tensor>& pieces, const Tensor& scratch, const SumLayout& layout,
                                    Reduction mode) {
  REMAT_CHECK(!pieces.empty() && layout.blocks.size() == static_cast<size_t>(world_size()) &&
                  pieces.size() == layout.blocks[static_cast<size_t>(rank())].size(),
              "distributed: a sum needs one piece per block of this rank (", pieces.size(), " given)");
  for (const Tensor& p : pieces)
    REMAT_CHECK(p.defined() && p.is_contiguous() && p.dim() == 1 && p.numel() == pieces.front().numel() &&
                    p.dtype() == pieces.front().dtype(),
                "distributed: the pieces of a sum must be contiguous 1-D tensors of one size and dtype");
  if (world_size() == 1) return std::make_unique<OneRank>(pieces, layout);
  // two ranks of one block each: the tree's last step is one addition per element, which any
  // MPI_Allreduce of two values makes (addition commutes): MPI's own, with the same bits
  const bool one_addition = layout.blocks.size() == 2 && layout.blocks[0].size() == 1 && layout.blocks[1].size() == 1;
  if (mode == Reduction::native || one_addition) return std::make_unique<NativeSum>(pieces);
  return std::make_unique<OrderedSum>(pieces, scratch, layout);
}

}  // namespace internal

}  // namespace remat::distributed
