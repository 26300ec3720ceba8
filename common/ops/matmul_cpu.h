// matmul_cpu.h: the CPU matrix product, cache-blocked and written so that the compiler vectorizes it.
// Defines sgemm in the BLAS convention (row-major here): C = alpha * op(A) @ op(B) + beta * C,
// where op(X) is X or X^T. Single-threaded and deterministic: the summation order depends only on
// the shapes, never on timing, so every rank computes bit-identical products. sgemm_cpu_bias is the
// same product started from a bias row (a linear layer's forward); sgemm_cpu_sum_a adds op(A)'s row
// sums on the way (a linear layer's bias gradient); sgemm_cpu_epilogue applies an element-wise function
// to each panel of C as it is finished (GELU fused into a product).
#pragma once

// A is M x K after op, B is K x N after op, C is M x N. lda/ldb/ldc are row strides in elements.
void sgemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc);

// C = op(A) @ op(B) + bias, the bias (N floats) added to every row: the same result, bit for bit, as
// copying the bias into every row of C and calling sgemm_cpu with alpha = 1 and beta = 1, without
// that pass over C (a linear layer's forward).
void sgemm_cpu_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, const float* bias, float* C, int ldc);

// sgemm_cpu with op(A) = A^T, which also adds the row sums of op(A) (the column sums of the stored
// A, K x M) into a_sums (M floats): a_sums[i] += A[0][i] + A[1][i] + ..., in that order, the same
// bits as a separate pass row by row. Taken as the product packs A, so A is read once: a linear
// layer's weight gradient (A = dout) with its bias's gradient.
void sgemm_cpu_sum_a(bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                     int ldb, float beta, float* C, int ldc, float* a_sums);

// What a product does to each block of C once the block's sums are final (after the last depth
// slice), while the block is still in cache (a panel of up to 96 rows: in L2): an element-wise
// function of C, so that the function's pass over memory (reading C back, as a separate op would)
// disappears. apply gets the block (rows ldc
// apart) and its place in C: rows [i, i + mr), columns [j, j + nr); x and y are what it reads and
// writes besides C, laid out as C, rows ld apart (e.g. y = GELU(C), or C = GELU'(x) * C).
struct SgemmEpilogue {
  void (*apply)(const SgemmEpilogue& e, float* c, int ldc, int i, int j, int mr, int nr);
  const float* x;
  float* y;
  int ld;
};

// sgemm_cpu with alpha = 1 (started from bias, when not null, as sgemm_cpu_bias; else from beta * C),
// then `epilogue` on every block of C, once.
void sgemm_cpu_epilogue(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, const float* bias, float* C, int ldc, const SgemmEpilogue& epilogue);
