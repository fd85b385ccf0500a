// BLIS's native row-major sgemm, kept apart from OpenBLAS's cblas.h (both define cblas_*).
#include <blis.h>

#include <cstdint>

void blis_sgemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  float alpha = 1.0f, beta = 0.0f;
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, const_cast<float*>(a), k, 1,
            const_cast<float*>(b), n, 1, &beta, c, n, 1);
}

void blis_set_threads(int threads) { bli_thread_set_num_threads(threads); }
