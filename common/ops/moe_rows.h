// moe_rows.h: the row movements of a mixture-of-experts layer (moe.h) around its experts, as ops that
// run where their tensors live: the dispatch of each token's row to its experts' groups, the combine
// of the experts' outputs weighted by the router, and their two backwards. Defines moe_dispatch,
// moe_combine, moe_combine_backward and moe_return_rows; the CPU loops are in moe_rows.cpp, the CUDA
// kernels in moe_rows_cuda.cu (fp32).
//
// The routing itself (the router's softmax, top-k, the capacity's claims in the global token order,
// the balance loss) is MoELayer's (moe.cpp): small, sequential by its nature (the claims), and what
// decides which assignment goes where. These ops take its decisions as index arrays:
//   k         choices per token; assignment a = t k + j is token t's j-th choice;
//   chosen(A) the expert of assignment a (A = N k);
//   row(A)    its row in the expert-grouped buffers, or -1 where capacity dropped it;
//   probs(N,E) the router's probabilities: assignment a's gate is probs[t, chosen[a]].
// Index arrays and probs live on the same device as the tensors. x, out, dout, dx: (N,C); rows, y,
// dy, drows: (n,C), n the kept assignments.
#pragma once
#include "ops/tensor.h"

// rows[row[a]] = x[a / k] for every kept assignment.
void moe_dispatch(Tensor rows, Tensor x, const int* row, int k);
// out[t] = sum over token t's kept assignments, in choice order, of gate * y[row[a]] (overwritten).
void moe_combine(Tensor out, Tensor y, const float* probs, const int* chosen, const int* row, int k, int E);
// The combine's backward: dy[row[a]] = gate * dout[t] (overwritten), and dgate[a] = <dout[t], y[row[a]]>
// (0 for a dropped assignment), the gradient of assignment a's gate, for the router's backward.
void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* probs, const int* chosen,
                          const int* row, int k, int E);
// The dispatch's backward: dx[t] += drows[row[a]] over token t's kept assignments, in choice order.
void moe_return_rows(Tensor dx, Tensor drows, const int* row, int k);
