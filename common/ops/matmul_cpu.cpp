// matmul_cpu.cpp: the CPU sgemm behind every linear layer when no GPU library is used.
//
// Blocking scheme (GotoBLAS / BLIS): C is walked in NC-wide column panels, K in KC-deep slices (one
// slice up to 2 KC deep when op(A) = A is read in place) and M in MC-tall row panels. For each (NC,
// KC) pair a KC x NC slice of op(B) is copied into NR-wide strips, and for each MC panel an MC x KC
// block of op(A) into MR-tall strips (when op(A) = A^T, MA rows at a time; when op(A) = A its rows
// are already contiguous in depth and are read in place, see sgemm_blocked). Packed strips are one
// cache line apart (strip_offset). Packing is what makes the kernel fast: the micro-kernel then
// reads both operands with unit stride from buffers that stay in L1 (B strip) and L2 (A block),
// whatever the transposes and leading dimensions were, and the transposes cost one copy instead of
// strided loads in the inner loop. Short edge strips are zero-padded so the micro-kernel always runs
// its full fixed-size loop.
//
// The micro-kernel keeps an MR x NR block of C in local accumulators (6 x 16 floats: 12 of the 16
// AVX2 registers) and does one rank-1 update per k. Its loops have compile-time trip counts, so GCC
// -O3 unrolls them and maps the accumulators to vector registers without intrinsics. Edge tiles
// go through a scratch tile, so the hot kernel never has a variable bound. The kernel either
// overwrites C (beta == 0) or starts its accumulators from C (alpha == 1 and beta == 1: a backward
// product that accumulates), from a bias row (sgemm_cpu_bias: a biased forward) or from a row of
// zeros (alpha == 1 and beta == 0 with A read in place: a backward product that overwrites); other
// alpha/beta also use the scratch tile. (Intrinsics buy nothing here: GCC emits the same broadcasts
// and fused multiply-adds, the same bits, and its loop alone runs at the core's measured peak rate;
// lessons/matmul/matmul_cpu_lesson's v5 shows both. Where a product loses is around the loop:
// packing, and operands that come from L3 or memory. docs/benchmarks.md has the measurements.)
//
// Determinism: every C element is a sum over k in increasing order, split at fixed KC boundaries
// (a deeper slice keeps the split where it merges, see sgemm_blocked), so the result depends only on
// the shapes and strides.
//
// Defines sgemm_cpu, sgemm_cpu_bias, sgemm_cpu_sum_a and sgemm_cpu_epilogue (declared in matmul_cpu.h).
#include "ops/matmul_cpu.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

// Two GCC-specific settings, for the micro-kernel only, are worth a factor of ~2 there. The loop
// vectorizer would otherwise try to vectorize along k (after the i and j loops are unrolled) and
// mangle the accumulators with permutes; without it the basic-block (SLP) vectorizer produces the
// intended broadcast + FMA code. Register-pressure-aware scheduling before register allocation
// keeps GCC from loading all six A values at once, which needs 18 registers and spills
// accumulators. Other compilers get the plain code.
#if defined(__GNUC__) && !defined(__clang__)
#define MICRO_KERNEL_ATTR __attribute__((optimize("no-tree-loop-vectorize", "schedule-insns", "sched-pressure")))
#else
#define MICRO_KERNEL_ATTR
#endif

constexpr int MR = 6;     // rows of the register block
constexpr int NR = 16;    // columns of the register block: two 8-float AVX2 vectors
constexpr int KC = 256;   // depth of a packed slice: one NR x KC strip of B is 16 KiB, fits L1
constexpr int MC = 96;    // rows of packed A per block: MC x KC = 96 KiB, fits L2
constexpr int NC = 2048;  // columns of packed B per panel: KC x NC = 2 MiB, meant for L3
constexpr int MA = 4 * MC; // rows of op(A) = A^T packed in one go: KC x MA = 384 KiB, see sgemm_blocked

// Where packed strip s of depth kc and width W starts: strips follow one another with one cache line
// between them. Without it a strip was kc x W floats, 6 or 16 KiB for kc = 256: the same address modulo
// 4 KiB every strip or two, so the packing's writes (one piece of each strip per row it reads) all fell
// in one or two of L1's 64 sets and evicted each other, 8 ways for 16 to 64 strips.
constexpr int kStripPad = 16;
template <int W>
std::ptrdiff_t strip_offset(int s, int kc) {
  return static_cast<std::ptrdiff_t>(s) * (static_cast<std::ptrdiff_t>(kc) * W + kStripPad);
}

// Packing copies a W-wide strip (W = MR rows of op(A), or NR columns of op(B)) of depth kc into
// dst, k-major: dst[k * W + w] is element w of the strip at depth k. Strips narrower than W (matrix
// edges) are zero-padded. Whatever the transposes, the strip is stored in one of two layouts, so
// both operands share these two routines. All inner loops have constant bounds: variable-length
// copies of a few floats otherwise become memmove calls.

// The W values at one depth are contiguous, depths are ld apart: op(A) = A^T, or op(B) = B.
template <int W>
void pack_rows(const float* __restrict src, int ld, int kc, int w, float* __restrict dst) {
  if (w == W) {
    for (int k = 0; k < kc; ++k) {
      const float* __restrict s = src + static_cast<std::ptrdiff_t>(k) * ld;
#pragma GCC unroll 32
      for (int j = 0; j < W; ++j) dst[k * W + j] = s[j];
    }
  } else {
    for (int k = 0; k < kc; ++k) {
      const float* __restrict s = src + static_cast<std::ptrdiff_t>(k) * ld;
      for (int j = 0; j < W; ++j) dst[k * W + j] = j < w ? s[j] : 0.0f;
    }
  }
}

// The same, for a whole kc x width panel whose rows are ld apart (op(A) = A^T, op(B) = B), into W-wide
// strips one after another, reading the panel row by row. Strip by strip (pack_rows per strip) read W
// floats from each of kc rows before moving on: a large-stride walk that the hardware prefetcher does
// not follow, so that nearly every row was a cache miss, and the next strip fetched the same lines
// again. Row by row, each row is one contiguous read.
// sums (width floats, or null): each row of the panel is also added into it, while the row is in L1.
// Over the depth slices in order, that is a column sum of the source in row order (a bias's
// gradient), without a second pass over the source.
template <int W>
void pack_rows_panel(const float* __restrict src, int ld, int kc, int width, float* __restrict dst,
                     float* __restrict sums = nullptr) {
  const int full = width / W;
  const std::ptrdiff_t strip = strip_offset<W>(1, kc);
  for (int k = 0; k < kc; ++k) {
    const float* __restrict s = src + static_cast<std::ptrdiff_t>(k) * ld;
    float* __restrict d = dst + k * W;
    for (int st = 0; st < full; ++st) {
#pragma GCC unroll 32
      for (int j = 0; j < W; ++j) d[st * strip + j] = s[st * W + j];
    }
    if (sums) {
      for (int j = 0; j < width; ++j) sums[j] += s[j];
    }
  }
  if (full * W < width) pack_rows<W>(src + full * W, ld, kc, width - full * W, dst + full * strip);
}

// Each of the W lines is contiguous in depth, lines are ld apart: op(A) = A, or op(B) = B^T.
// This is a transpose. Going KB depths at a time, with constant trip counts on both inner loops,
// lets GCC turn each KB x W block into vector loads and shuffles; short edge strips take the
// scalar path with zero padding.
template <int W>
void pack_cols(const float* __restrict src, int ld, int kc, int w, float* __restrict dst) {
  constexpr int KB = 8;
  const int kc_main = w == W ? kc - kc % KB : 0;
  for (int k0 = 0; k0 < kc_main; k0 += KB) {
    const float* __restrict s = src + k0;
    float* __restrict d = dst + k0 * W;
#pragma GCC unroll 8
    for (int k = 0; k < KB; ++k) {
#pragma GCC unroll 32
      for (int j = 0; j < W; ++j) d[k * W + j] = s[static_cast<std::ptrdiff_t>(j) * ld + k];
    }
  }
  for (int k = kc_main; k < kc; ++k) {
    for (int j = 0; j < W; ++j) dst[k * W + j] = j < w ? src[static_cast<std::ptrdiff_t>(j) * ld + k] : 0.0f;
  }
}

// Packs op(A)[i0:i0+mc, k0:k0+kc] into MR-row strips, one after another. a_sums (op(A) = A^T only):
// a_sums[i0 + i] += op(A)[i0 + i, k0:k0+kc], k increasing.
void pack_a(bool trans, const float* A, int lda, int i0, int k0, int mc, int kc, float* dst,
            float* a_sums = nullptr) {
  if (trans) {
    pack_rows_panel<MR>(A + static_cast<std::ptrdiff_t>(k0) * lda + i0, lda, kc, mc, dst,
                        a_sums ? a_sums + i0 : nullptr);
    return;
  }
  for (int is = 0; is < mc; is += MR) {
    const int mr = std::min(MR, mc - is);
    pack_cols<MR>(A + static_cast<std::ptrdiff_t>(i0 + is) * lda + k0, lda, kc, mr, dst);
    dst += strip_offset<MR>(1, kc);
  }
}

// Packs op(B)[k0:k0+kc, j0:j0+nc] into NR-column strips, one after another.
void pack_b(bool trans, const float* B, int ldb, int k0, int j0, int kc, int nc, float* dst) {
  if (!trans) {
    pack_rows_panel<NR>(B + static_cast<std::ptrdiff_t>(k0) * ldb + j0, ldb, kc, nc, dst);
    return;
  }
  for (int js = 0; js < nc; js += NR) {
    const int nr = std::min(NR, nc - js);
    pack_cols<NR>(B + static_cast<std::ptrdiff_t>(j0 + js) * ldb + k0, ldb, kc, nr, dst);
    dst += strip_offset<NR>(1, kc);
  }
}

// One MR x NR block of C (rows ldc apart) from one packed A strip and one packed B strip:
//   Accumulate = false: C = alpha * Ap @ Bp      (C is not read)
//   Accumulate = true:  C = Cin + Ap @ Bp        (alpha must be 1; the accumulators start from Cin,
//                                                 rows ldc_in apart: C itself, or a bias row, ldc_in = 0)
// Both variants read or write C only before and after the k loop, with constant bounds. A single
// kernel choosing between them at run time (or computing alpha * acc + beta * C) made GCC spill
// the accumulators, hence the template and merge_tile for the other cases.
// PackedA = false reads A where it lies instead of from a packed strip: op(A) = A with row i of the
// strip at Ap + i * lda, contiguous in depth (see sgemm_cpu for why).
template <bool Accumulate, bool PackedA = true>
MICRO_KERNEL_ATTR void micro_kernel(int kc, const float* __restrict Ap, const float* __restrict Bp, float alpha,
                                    const float* Cin, int ldc_in, float* C, int ldc, int lda = 0) {
  float acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const float* c = Cin + static_cast<std::ptrdiff_t>(i) * ldc_in;
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[i][j] = Accumulate ? c[j] : 0.0f;
  }
  for (int k = 0; k < kc; ++k) {
    const float* __restrict b = Bp + k * NR;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float a = PackedA ? Ap[k * MR + i] : Ap[static_cast<std::ptrdiff_t>(i) * lda + k];
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) acc[i][j] += a * b[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* c = C + static_cast<std::ptrdiff_t>(i) * ldc;
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) c[j] = Accumulate ? acc[i][j] : alpha * acc[i][j];
  }
}

// C[0:mr, 0:nr] = tile + beta * C. beta == 0 never reads C, so C may start as garbage (NaN * 0
// would otherwise leak through).
void merge_tile(const float* __restrict tile, float beta, float* __restrict C, int ldc, int mr, int nr) {
  for (int i = 0; i < mr; ++i) {
    float* __restrict c = C + static_cast<std::ptrdiff_t>(i) * ldc;
    const float* __restrict t = tile + i * NR;
    if (beta == 0.0f) {
      for (int j = 0; j < nr; ++j) c[j] = t[j];
    } else if (nr == NR) {
      // Constant trip count on the common path so the merge is fully vectorized.
      for (int j = 0; j < NR; ++j) c[j] = t[j] + beta * c[j];
    } else {
      for (int j = 0; j < nr; ++j) c[j] = t[j] + beta * c[j];
    }
  }
}

// C[0:mr, 0:nr] = tile + bias, the same sum as merge_tile with beta = 1 onto rows that hold the bias.
void merge_tile_bias(const float* __restrict tile, const float* __restrict bias, float* __restrict C, int ldc,
                     int mr, int nr) {
  for (int i = 0; i < mr; ++i) {
    float* __restrict c = C + static_cast<std::ptrdiff_t>(i) * ldc;
    const float* __restrict t = tile + i * NR;
    for (int j = 0; j < nr; ++j) c[j] = t[j] + bias[j];
  }
}

// Scales C by beta when there is nothing to multiply (K == 0 or alpha == 0); beta == 0 writes zeros.
void scale_c(int M, int N, float beta, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    float* c = C + static_cast<std::ptrdiff_t>(i) * ldc;
    if (beta == 0.0f) {
      std::fill(c, c + N, 0.0f);
    } else if (beta != 1.0f) {
      for (int j = 0; j < N; ++j) c[j] *= beta;
    }
  }
}

// Where an overwriting kernel that reads its start from memory starts: zeros, one row for all rows.
alignas(64) constexpr float kZeroRow[NR] = {};

// 64-byte alignment keeps every packed row on whole cache lines and lets loads be aligned.
struct AlignedBuffer {
  std::vector<float> storage;
  float* data = nullptr;
  float* get(std::size_t n) {
    if (storage.size() < n + 16) {
      storage.assign(n + 16, 0.0f);
      auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
      data = storage.data() + ((64 - addr % 64) % 64) / sizeof(float);
    }
    return data;
  }
};

// sgemm_cpu and sgemm_cpu_bias. With a bias (alpha = 1, beta ignored), the first K slice starts every
// tile from the bias instead of from C: the same sums, in the same order, as writing the bias into C
// and accumulating onto it with beta = 1, without that extra pass over C.
// epilogue (or null): applied to each MC-row panel of C after the last K slice. a_sums (op(A) = A^T
// only, else null): a_sums[i] += sum over k of op(A)[i, k], in increasing k, taken while the first
// column panel packs A.
void sgemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, const float* bias, float* C, int ldc,
                   float* a_sums = nullptr, const SgemmEpilogue* epilogue = nullptr) {
  // Per-thread so concurrent callers (e.g. one thread per rank) never share packing space.
  thread_local AlignedBuffer a_buf, b_buf;
  // With op(A) = A read in place and K up to 2 KC (the input gradients of qkv and fc, K = 384 and 512;
  // the fc projection's forward), the whole depth is one slice: C is written once instead of written,
  // read back and written again, and B packed once. Its B strips are then up to 32 KiB, but every
  // tile reads its strip from start to end, which the caches follow (about 5% faster on those shapes).
  const int kc_block = !trans_a && K <= 2 * KC ? K : KC;
  const int kc_max = std::min(K, kc_block);
  const int nc_max = std::min(N, NC);
  // op(A) = A^T is packed MA rows at a time (below); op(A) = A only its short edge strips, per MC panel.
  const int mc_max = std::min(M, trans_a ? MA : MC);
  float* Bp = b_buf.get(strip_offset<NR>((nc_max + NR - 1) / NR, kc_max));
  float* Ap = a_buf.get(strip_offset<MR>((mc_max + MR - 1) / MR, kc_max));

  for (int j0 = 0; j0 < N; j0 += NC) {
    const int nc = std::min(NC, N - j0);
    for (int k0 = 0; k0 < K; k0 += kc_block) {
      const int kc = std::min(kc_block, K - k0);
      // The first K slice applies the caller's beta; later slices accumulate onto it.
      const float beta_k = k0 == 0 ? beta : 1.0f;
      const bool from_bias = bias != nullptr && k0 == 0;
      const bool last_slice = k0 + kc == K;
      pack_b(trans_b, B, ldb, k0, j0, kc, nc, Bp);
      alignas(64) float tile[MR * NR];
      for (int i0 = 0; i0 < M; i0 += MC) {
        const int mc = std::min(MC, M - i0);
        // op(A) = A: full MR-row strips are read in place (each row is contiguous in depth, which is
        // all the kernel needs), and only a short last strip is packed, zero-padded. Packing these
        // strips was a transpose of every element of A, an eighth of the time of a product with K =
        // 128; read in place, A costs one broadcast load per row and depth, as from a packed strip.
        const bool a_in_place = !trans_a;
        const int mc_full = a_in_place ? mc - mc % MR : 0;
        // op(A) = A^T: the rows of the stored A are contiguous along M, and MC of them (384 bytes of
        // a dout row) at a time made every row of the slice a cold miss that nothing fetched ahead:
        // packing took a quarter of a weight gradient's time. MA rows at a time (several MC panels,
        // or all of M) read longer pieces of each row, which the hardware prefetcher streams.
        float* a_block = Ap;
        if (trans_a) {
          if (i0 % MA == 0) {
            pack_a(true, A, lda, i0, k0, std::min(MA, M - i0), kc, Ap, j0 == 0 ? a_sums : nullptr);
          }
          a_block = Ap + strip_offset<MR>((i0 % MA) / MR, kc);
        } else if (mc_full < mc) {
          float* edge_strips = Ap + strip_offset<MR>(mc_full / MR, kc);
          pack_a(false, A, lda, i0 + mc_full, k0, mc - mc_full, kc, edge_strips);
        }
        for (int js = 0; js < nc; js += NR) {
          const int nr = std::min(NR, nc - js);
          const float* b_strip = Bp + strip_offset<NR>(js / NR, kc);
          for (int is = 0; is < mc; is += MR) {
            const int mr = std::min(MR, mc - is);
            // The next tile's rows of C, fetched while this tile computes: the kernel reads C (or
            // writes it) only before and after its loop, and a cold row stalls it there.
            if (is + MR < mc) {
              const float* next = C + static_cast<std::ptrdiff_t>(i0 + is + MR) * ldc + j0 + js;
              for (int i = 0; i < std::min(MR, mc - is - MR); ++i) {
                __builtin_prefetch(next + static_cast<std::ptrdiff_t>(i) * ldc);
                __builtin_prefetch(next + static_cast<std::ptrdiff_t>(i) * ldc + NR - 1);
              }
            }
            const float* a_strip = a_block + strip_offset<MR>(is / MR, kc);
            float* c = C + static_cast<std::ptrdiff_t>(i0 + is) * ldc + j0 + js;
            const bool full = mr == MR && nr == NR;
            // A slice may be deeper than KC (op(A) = A, see kc_block). A tile whose sums are one chain
            // of multiply-adds from where it starts runs the whole slice; a tile that sums apart and
            // merges (an edge, alpha != 1) does so per KC-deep part, as it did when every slice was KC
            // deep, so that its bits are what they were.
            const bool one_chain = full && alpha == 1.0f && is < mc_full &&
                                   (from_bias || beta_k == 0.0f || beta_k == 1.0f);
            if (one_chain) {
              // The common tile (A in place, full): its accumulators start from the bias row, from C
              // (a backward product that accumulates) or from a row of zeros (one that overwrites:
              // the same sums as from a zeroed tile, without the tile's pass through memory).
              const float* start = from_bias ? bias + j0 + js : beta_k == 1.0f ? c : kZeroRow;
              const int ld_start = from_bias || beta_k == 0.0f ? 0 : ldc;
              const float* a_rows = A + static_cast<std::ptrdiff_t>(i0 + is) * lda + k0;
              micro_kernel<true, false>(kc, a_rows, b_strip, 1.0f, start, ld_start, c, ldc, lda);
              continue;
            }
            for (int kk = 0; kk < kc; kk += KC) {
              const int kp = std::min(KC, kc - kk);
              const float beta_p = kk == 0 ? beta_k : 1.0f;
              const bool bias_p = from_bias && kk == 0;
              const float* bias_tile = bias_p ? bias + j0 + js : nullptr;
              const float* a_part = a_strip + static_cast<std::ptrdiff_t>(kk) * MR;
              const float* b_part = b_strip + static_cast<std::ptrdiff_t>(kk) * NR;
              if (bias_p) {
                // alpha == 1. Full tiles start from the bias row (ldc_in = 0: every row the same); edge
                // tiles add it when merging, as merge_tile adds C.
                const float* a = is < mc_full ? A + static_cast<std::ptrdiff_t>(i0 + is) * lda + k0 + kk : a_part;
                if (full) {
                  if (is < mc_full) {
                    micro_kernel<true, false>(kp, a, b_part, 1.0f, bias_tile, 0, c, ldc, lda);
                  } else {
                    micro_kernel<true>(kp, a, b_part, 1.0f, bias_tile, 0, c, ldc);
                  }
                } else {
                  if (is < mc_full) {
                    std::fill(tile, tile + MR * NR, 0.0f);
                    micro_kernel<true, false>(kp, a, b_part, 1.0f, tile, NR, tile, NR, lda);
                  } else {
                    micro_kernel<false>(kp, a, b_part, 1.0f, tile, NR, tile, NR);
                  }
                  merge_tile_bias(tile, bias_tile, c, ldc, mr, nr);
                }
              } else if (is < mc_full) {
                // A in place (then mr == MR): the same sums, in the same order, as from a packed strip.
                // Only the accumulating kernel is used (GCC spilled the accumulators of a second
                // instance): other cases accumulate onto a zeroed tile, then scale and merge it.
                const float* a_rows = A + static_cast<std::ptrdiff_t>(i0 + is) * lda + k0 + kk;
                if (full && beta_p == 1.0f && alpha == 1.0f) {
                  micro_kernel<true, false>(kp, a_rows, b_part, alpha, c, ldc, c, ldc, lda);
                } else if (full && beta_p == 0.0f && alpha == 1.0f) {
                  // Overwriting C: the accumulators start from a row of zeros (ldc_in = 0), the same
                  // sums as from a zeroed tile, without the tile's extra pass through memory.
                  micro_kernel<true, false>(kp, a_rows, b_part, alpha, kZeroRow, 0, c, ldc, lda);
                } else {
                  std::fill(tile, tile + MR * NR, 0.0f);
                  micro_kernel<true, false>(kp, a_rows, b_part, 1.0f, tile, NR, tile, NR, lda);
                  if (alpha != 1.0f) {
                    for (float& t : tile) t *= alpha;
                  }
                  merge_tile(tile, beta_p, c, ldc, mr, nr);
                }
              } else if (full && beta_p == 0.0f) {
                micro_kernel<false>(kp, a_part, b_part, alpha, c, ldc, c, ldc);
              } else if (full && beta_p == 1.0f && alpha == 1.0f) {
                micro_kernel<true>(kp, a_part, b_part, alpha, c, ldc, c, ldc);
              } else {
                // Edge tiles and general alpha/beta: compute into scratch, then merge what fits.
                micro_kernel<false>(kp, a_part, b_part, alpha, tile, NR, tile, NR);
                merge_tile(tile, beta_p, c, ldc, mr, nr);
              }
            }
          }
        }
        // The row panel's block of C is final: the epilogue walks it row by row while it is in L2 (tile
        // by tile, its reads of x and writes of y were cold, strided misses that doubled the product).
        if (epilogue && last_slice) {
          epilogue->apply(*epilogue, C + static_cast<std::ptrdiff_t>(i0) * ldc + j0, ldc, i0, j0, mc, nc);
        }
      }
    }
  }
}

}  // namespace

void sgemm_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  sgemm_blocked(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc);
}

void sgemm_cpu_bias(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, const float* bias, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < M; ++i) std::copy(bias, bias + N, C + static_cast<std::ptrdiff_t>(i) * ldc);
    return;
  }
  sgemm_blocked(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, bias, C, ldc);
}

void sgemm_cpu_sum_a(bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                     int ldb, float beta, float* C, int ldc, float* a_sums) {
  if (M <= 0) return;
  if (N <= 0 || K <= 0 || alpha == 0.0f) {
    // Nothing packs A: the same sums, row by row of A.
    for (int k = 0; k < K; ++k) {
      const float* a = A + static_cast<std::ptrdiff_t>(k) * lda;
      for (int i = 0; i < M; ++i) a_sums[i] += a[i];
    }
    if (N > 0) scale_c(M, N, beta, C, ldc);
    return;
  }
  sgemm_blocked(true, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc, a_sums);
}

void sgemm_cpu_epilogue(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                        int ldb, float beta, const float* bias, float* C, int ldc, const SgemmEpilogue& epilogue) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (bias) {
      for (int i = 0; i < M; ++i) std::copy(bias, bias + N, C + static_cast<std::ptrdiff_t>(i) * ldc);
    } else {
      scale_c(M, N, beta, C, ldc);
    }
    epilogue.apply(epilogue, C, ldc, 0, 0, M, N);
    return;
  }
  sgemm_blocked(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, bias ? 0.0f : beta, bias, C, ldc, nullptr,
                &epilogue);
}
