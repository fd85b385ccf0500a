// CUDA 2-D convolution through cuDNN's convolution API (cudnnConvolutionForward / BackwardData /
// BackwardFilter), NCHW tensors and OIHW filters with groups. Determinism: each direction takes a
// named algorithm that cuDNN documents as deterministic (forward IMPLICIT_PRECOMP_GEMM, backward
// data ALGO_1, backward filter ALGO_1) when cuDNN supports it for the problem, else the first
// algorithm of cuDNN's heuristic list (a function of the problem, never of timing) that cuDNN
// reports as CUDNN_DETERMINISTIC; the math type is FMA (no TF32) unless the backend option tf32.
// The bias gradient is the backend's fixed-order reduction of gy over N, H and W.
#include <limits>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

namespace {

int dim(int64_t v, const char* what) {
  REMAT_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "conv2d on cuda: ", what, " ", v,
              " exceeds what cuDNN takes (2^31 - 1)");
  return static_cast<int>(v);
}

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;

  // x [N, C, H, W], w [O, C / groups, KH, KW], y [N, O, OH, OW]
  Descriptors(const Shape& xs, const Shape& ws, const Shape& ys, DType dtype, const Conv2dGeometry& g, bool tf32) {
    REMAT_CHECK(dtype == DType::f32 || dtype == DType::f64, "conv2d on cuda: unsupported dtype ", dtype_name(dtype));
    type = dtype == DType::f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
    check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    check(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, type, dim(xs[0], "batch"), dim(xs[1], "channels"),
                                     dim(xs[2], "height"), dim(xs[3], "width")),
          "cudnnSetTensor4dDescriptor (input)");
    check(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, type, dim(ys[0], "batch"), dim(ys[1], "channels"),
                                     dim(ys[2], "height"), dim(ys[3], "width")),
          "cudnnSetTensor4dDescriptor (output)");
    check(cudnnSetFilter4dDescriptor(w, type, CUDNN_TENSOR_NCHW, dim(ws[0], "filters"), dim(ws[1], "channels"),
                                     dim(ws[2], "kernel height"), dim(ws[3], "kernel width")),
          "cudnnSetFilter4dDescriptor");
    check(cudnnSetConvolution2dDescriptor(conv, dim(g.pad_h, "padding"), dim(g.pad_w, "padding"),
                                          dim(g.stride_h, "stride"), dim(g.stride_w, "stride"),
                                          dim(g.dilation_h, "dilation"), dim(g.dilation_w, "dilation"),
                                          CUDNN_CROSS_CORRELATION, type),
          "cudnnSetConvolution2dDescriptor");
    check(cudnnSetConvolutionGroupCount(conv, dim(g.groups, "groups")), "cudnnSetConvolutionGroupCount");
    // float32 without TF32: FMA kernels only; float64 has no reduced-precision kernels to exclude
    const bool fma_only = dtype == DType::f32 && !tf32;
    check(cudnnSetConvolutionMathType(conv, fma_only ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH),
          "cudnnSetConvolutionMathType");
  }
  ~Descriptors() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

// The preferred algorithm if cuDNN lists it as supported and deterministic, else the first
// supported deterministic one of the list (cuDNN's heuristic order).
template <class Perf, class Algo>
Algo choose(const std::vector<Perf>& list, int returned, Algo preferred, const char* what) {
  for (int i = 0; i < returned; ++i)
    if (list[i].algo == preferred && list[i].status == CUDNN_STATUS_SUCCESS &&
        list[i].determinism == CUDNN_DETERMINISTIC)
      return preferred;
  for (int i = 0; i < returned; ++i)
    if (list[i].status == CUDNN_STATUS_SUCCESS && list[i].determinism == CUDNN_DETERMINISTIC) return list[i].algo;
  throw Error(detail::concat("conv2d on cuda: cuDNN offers no deterministic ", what, " algorithm for this problem"));
}

// Workspace memory for cuDNN, from the accounted allocator (empty when none is needed).
Tensor workspace(CudaBackend& be, size_t bytes) {
  return bytes == 0 ? Tensor() : be.scratch(Shape{static_cast<int64_t>((bytes + 7) / 8)}, DType::i64);
}
void* data_of(const Tensor& t) { return t.defined() ? t.storage()->data() : nullptr; }
const void* at(const Tensor& t) {
  return static_cast<const char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
}
void* at_mut(const Tensor& t) { return const_cast<void*>(at(t)); }

// alpha = 1 and beta = 0 (or 1) in the data type's host scalar
struct Scalars {
  float f[2] = {0.0f, 1.0f};
  double d[2] = {0.0, 1.0};
  const void* get(DType dtype, int v) const { return dtype == DType::f32 ? static_cast<const void*>(&f[v]) : &d[v]; }
};

// One cuDNN call of a direction: the algorithm from cuDNN's list (find), its workspace (size),
// from the accounted allocator, then the call (run).
template <class Perf, class Algo, class Find, class Size, class Run>
void run_algorithm(CudaBackend& be, int count, Algo preferred, const char* what, Find&& find, Size&& size, Run&& run) {
  std::vector<Perf> list(static_cast<size_t>(count));
  int returned = 0;
  check(find(count, &returned, list.data()), detail::concat("cuDNN ", what, " algorithm list").c_str());
  const Algo algo = choose(list, returned, preferred, what);
  size_t bytes = 0;
  check(size(algo, &bytes), detail::concat("cuDNN ", what, " workspace size").c_str());
  Tensor ws = workspace(be, bytes);
  check(run(algo, data_of(ws), bytes), detail::concat("cuDNN convolution ", what).c_str());
  note_launch("conv2d (cuDNN)");
}

}  // namespace

void CudaBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias, const Conv2dGeometry& g,
                         const Tensor& y) {
  REMAT_ASSERT(y.is_contiguous(), "conv2d: output must be contiguous");
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(w_in);
  Descriptors d(x.shape(), w.shape(), y.shape(), y.dtype(), g, options_.tf32);
  const Scalars s;
  if (x.numel() == 0 || w.numel() == 0) {
    fill(y, 0.0);
  } else {
    using Perf = cudnnConvolutionFwdAlgoPerf_t;
    using Algo = cudnnConvolutionFwdAlgo_t;
    run_algorithm<Perf>(
        *this, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, "forward",
        [&](int n, int* returned, Perf* list) {
          return cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, d.x, d.w, d.conv, d.y, n, returned, list);
        },
        [&](Algo algo, size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(cudnn_, d.x, d.w, d.conv, d.y, algo, bytes);
        },
        [&](Algo algo, void* ws, size_t bytes) {
          return cudnnConvolutionForward(cudnn_, s.get(y.dtype(), 1), d.x, at(x), d.w, at(w), d.conv, algo, ws, bytes,
                                         s.get(y.dtype(), 0), d.y, at_mut(y));
        });
  }
  if (bias.defined()) {
    Tensor b = contiguous(bias);
    cudnnTensorDescriptor_t bd = nullptr;
    check(cudnnCreateTensorDescriptor(&bd), "cudnnCreateTensorDescriptor");
    const cudnnStatus_t set =
        cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, d.type, 1, dim(y.shape()[1], "channels"), 1, 1);
    const cudnnStatus_t add = set == CUDNN_STATUS_SUCCESS ? cudnnAddTensor(cudnn_, s.get(y.dtype(), 1), bd, at(b),
                                                                           s.get(y.dtype(), 1), d.y, at_mut(y))
                                                          : set;
    cudnnDestroyTensorDescriptor(bd);
    check(add, "cudnnAddTensor (bias)");
  }
}

void CudaBackend::conv2d_backward_input(const Tensor& gy_in, const Tensor& w_in, const Conv2dGeometry& g,
                                        const Tensor& gx) {
  REMAT_ASSERT(gx.is_contiguous(), "conv2d_backward_input: output must be contiguous");
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor gy = contiguous(gy_in), w = contiguous(w_in);
  if (gy.numel() == 0 || w.numel() == 0) return fill(gx, 0.0);
  Descriptors d(gx.shape(), w.shape(), gy.shape(), gx.dtype(), g, options_.tf32);
  const Scalars s;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  run_algorithm<Perf>(
      *this, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, "backward data",
      [&](int n, int* returned, Perf* list) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, d.w, d.y, d.conv, d.x, n, returned, list);
      },
      [&](Algo algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, d.w, d.y, d.conv, d.x, algo, bytes);
      },
      [&](Algo algo, void* ws, size_t bytes) {
        return cudnnConvolutionBackwardData(cudnn_, s.get(gx.dtype(), 1), d.w, at(w), d.y, at(gy), d.conv, algo, ws,
                                            bytes, s.get(gx.dtype(), 0), d.x, at_mut(gx));
      });
}

void CudaBackend::conv2d_backward_weight(const Tensor& x_in, const Tensor& gy_in, const Conv2dGeometry& g,
                                         const Tensor& gw, const Tensor& gbias) {
  DeviceGuard guard(device_);
  Tensor gy = contiguous(gy_in);
  if (gbias.defined() && gbias.numel() > 0) reduce(ReduceOp::sum, gy, {0, 2, 3}, gbias);
  if (!gw.defined() || gw.numel() == 0) return;
  REMAT_ASSERT(gw.is_contiguous(), "conv2d_backward_weight: output must be contiguous");
  Tensor x = contiguous(x_in);
  if (x.numel() == 0 || gy.numel() == 0) return fill(gw, 0.0);
  Descriptors d(x.shape(), gw.shape(), gy.shape(), gw.dtype(), g, options_.tf32);
  const Scalars s;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  run_algorithm<Perf>(
      *this, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, "backward filter",
      [&](int n, int* returned, Perf* list) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, d.x, d.y, d.conv, d.w, n, returned, list);
      },
      [&](Algo algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, d.x, d.y, d.conv, d.w, algo, bytes);
      },
      [&](Algo algo, void* ws, size_t bytes) {
        return cudnnConvolutionBackwardFilter(cudnn_, s.get(gw.dtype(), 1), d.x, at(x), d.y, at(gy), d.conv, algo, ws,
                                              bytes, s.get(gw.dtype(), 0), d.w, at_mut(gw));
      });
}

}  // namespace remat::cuda
