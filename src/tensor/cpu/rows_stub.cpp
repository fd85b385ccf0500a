// TEMPORARY: placeholders replaced by the rows/indexing kernel files.
#include "tensor/cpu/cpu_backend.h"
namespace remat::cpu {
#define NI(name) throw Error(#name ": not implemented yet")
void CpuBackend::softmax(const Tensor&, const Tensor&, bool) { NI(softmax); }
void CpuBackend::softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool) { NI(softmax); }
void CpuBackend::layer_norm(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) { NI(layer_norm); }
void CpuBackend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { NI(layer_norm); }
void CpuBackend::rms_norm(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) { NI(rms_norm); }
void CpuBackend::rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { NI(rms_norm); }
void CpuBackend::embedding(const Tensor&, const Tensor&, const Tensor&) { NI(embedding); }
void CpuBackend::embedding_backward(const Tensor&, const Tensor&, const Tensor&) { NI(embedding); }
void CpuBackend::cross_entropy(const Tensor&, const Tensor&, double, int64_t, const Tensor&, const Tensor&) { NI(cross_entropy); }
void CpuBackend::cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, double, int64_t, const Tensor&) { NI(cross_entropy); }
void CpuBackend::dropout(const Tensor&, double, RngState, const Tensor&) { NI(dropout); }
}
