// matmul_cpu.h: the CPU matrix product, cache-blocked and written so that the compiler vectorizes it.
// Defines sgemm in the BLAS convention (row-major here): C = alpha * op(A) @ op(B) + beta * C,
// where op(X) is X or X^T. Single-threaded and deterministic: the summation order depends only on
// the shapes, never on timing, so every rank computes bit-identical products. sgemm_cpu_bias is the
// same product started from a bias row (a linear layer's forward).
#pragma once

// A is M x K after op, B is K x N after op, C is M x N. lda/ldb/ldc are row strides in elements.
void sgemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);

// C = op(A) @ op(B) + bias, the bias (N floats) added to every row: the same result, bit for bit, as
// copying the bias into every row of C and calling sgemm_cpu with alpha = 1 and beta = 1, without
// that pass over C (a linear layer's forward).
void sgemm_cpu_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, const float* bias, float* C, int ldc);
