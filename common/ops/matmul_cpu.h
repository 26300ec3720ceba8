// matmul_cpu.h: the CPU matrix product, cache-blocked and written so that the compiler vectorizes it.
// Defines sgemm in the BLAS convention (row-major here): C = alpha * op(A) @ op(B) + beta * C,
// where op(X) is X or X^T. Single-threaded and deterministic: the summation order depends only on
// the shapes, never on timing, so every rank computes bit-identical products.
#pragma once

// A is M x K after op, B is K x N after op, C is M x N. lda/ldb/ldc are row strides in elements.
void sgemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);
