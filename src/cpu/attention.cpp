// CPU reference attention: one query row at a time, in f64, over (batch, head, block of query rows) in
// parallel. Keys and values with contiguous channels are read in place (the products and sums in f64,
// vectorised); otherwise each work item copies the keys and values its rows can see into f64 buffers once,
// so strided, broadcast and grouped k/v cost one gather per block, not one per row.
#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <cblas.h>

#include "core/dispatch.h"
#include "cpu/clones.h"

namespace kiln::cpu {
namespace {

namespace am = attention_math;

constexpr int64_t kRowBlock = 32;  // query rows per work item: the k/v gather is 1/32 of the row work

// acc += p v over n channels in f64, with AVX2 clones (cpu/clones.h; q . k is simd_dot there).
template <class S>
KILN_SIMD_CLONES void axpy_f64(double* __restrict acc, double p, const S* __restrict v, int64_t n) {
#if KILN_F16C_KERNELS
  if constexpr (std::is_same_v<S, Half>)
    if (have_f16c()) return f16c_axpy_f64(acc, p, reinterpret_cast<const uint16_t*>(v), n);
#endif
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) acc[c] += p * convert<double>(v[c]);
}

// Query rows [i0, i1) of one (outer, head) task for 16-bit q/k/v with contiguous channels (a bool or f32
// mask, or none), in f32 through BLAS: S = q k^T over the nk keys the block can see, the mask, the softmax
// of each row over its own visible keys, o = p v, all in f32 (the result rounds to 16 bits, far above f32's error). The same
// semantics as the f64 rows: a row without a visible key gives 0, a NaN score makes its row NaN, and an
// invisible key contributes nothing; a visible key whose p is 0 must also contribute nothing even where
// its value is inf, so a block whose values are not all finite returns false and takes the f64 rows.
template <class T>
bool block_f32(T* op, const T* qp, const T* kp, const T* vp, const char* mp, const am::Layout& L,
               const am::Offsets& off, int64_t task, int64_t i0, int64_t i1, int64_t kv_len, int64_t nk, float scale,
               std::vector<float>& qb, std::vector<float>& kb, std::vector<float>& vb, std::vector<float>& sb,
               std::vector<float>& ob) {
  const int64_t rows = i1 - i0, d = L.d, dv = L.dv;
  kb.resize(static_cast<size_t>(nk * d));
  vb.resize(static_cast<size_t>(nk * dv));
  for (int64_t j = 0; j < nk; ++j) {
    // Rows widened with simd_widen (F16C for f16: one element at a time, the conversion dominated prefill).
    float* vo = vb.data() + j * dv;
    simd_widen(vp + off.v + j * L.v_row, dv, vo);
    bool finite = true;
    for (int64_t c = 0; c < dv; ++c) finite &= std::isfinite(vo[c]);
    if (!finite) return false;
    simd_widen(kp + off.k + j * L.k_row, d, kb.data() + j * d);
  }
  qb.resize(static_cast<size_t>(rows * d));
  for (int64_t r = 0; r < rows; ++r) simd_widen(qp + off.q + (i0 + r) * L.q_row, d, qb.data() + r * d);
  sb.resize(static_cast<size_t>(rows * nk));
  ob.resize(static_cast<size_t>(rows * dv));
  if (nk > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(nk),
                static_cast<int>(d), scale, qb.data(), static_cast<int>(d), kb.data(), static_cast<int>(d), 0.f,
                sb.data(), static_cast<int>(nk));
  std::vector<float> inv(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = sb.data() + r * nk;
    const int64_t e = am::key_end(i0 + r, L.lq, kv_len, L.causal, L.has_lengths);
    if (mp) {  // bool (true = attend) or f32 added to the scaled scores
      const int64_t mrow = off.m + (i0 + r) * L.m_row;
      for (int64_t j = 0; j < e; ++j) {
        const int64_t idx = mrow + j * L.m_col;
        if (L.mask == am::MaskKind::Bool) {
          if (!reinterpret_cast<const bool*>(mp)[idx]) sr[j] = -INFINITY;
        } else {
          sr[j] += reinterpret_cast<const float*>(mp)[idx];
        }
      }
    }
    float m = -INFINITY;
    bool any_nan = false;
    for (int64_t j = 0; j < e; ++j) {
      if (sr[j] > m) m = sr[j];
      any_nan |= std::isnan(sr[j]);
    }
    if (m == -INFINITY && !any_nan) {  // no key to attend: 0
      std::fill(sr, sr + nk, 0.f);
      inv[r] = 0.f;
      continue;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < e; ++j) {
      sr[j] = std::exp(sr[j] - m);
      sum += sr[j];
    }
    std::fill(sr + e, sr + nk, 0.f);
    inv[r] = 1.f / sum;
  }
  if (nk > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(dv),
                static_cast<int>(nk), 1.f, sb.data(), static_cast<int>(nk), vb.data(), static_cast<int>(dv), 0.f,
                ob.data(), static_cast<int>(dv));
  else
    std::fill(ob.begin(), ob.end(), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = ob.data() + r * dv;
    for (int64_t c = 0; c < dv; ++c) o[c] *= inv[r];
    simd_narrow(o, dv, op + (task * L.lq + i0 + r) * dv);
  }
  return true;
}

// Query rows [i0, i1) of one task for 16-bit q/k/v with contiguous channels (a bool or f32 mask, or none), a
// row at a time in f32: the rows block_f32 does not take (blocks of fewer than 8 rows: decode). The f64 rows'
// semantics: a row without a visible key gives 0, a NaN score makes its row NaN, a key whose p is 0 contributes
// nothing (even an inf value). In f64 these rows cost twice the vector work for a result rounded to 16 bits.
template <class T>
void rows_f32(T* op, const T* qp, const T* kp, const T* vp, const char* mp, const am::Layout& L, const am::Offsets& off,
              int64_t task, int64_t i0, int64_t i1, int64_t kv_len, float scale, std::vector<float>& qb,
              std::vector<float>& sb, std::vector<float>& vb, std::vector<float>& ob) {
  const int64_t d = L.d, dv = L.dv;
  qb.resize(static_cast<size_t>(d));
  vb.resize(static_cast<size_t>(dv));
  ob.resize(static_cast<size_t>(dv));
  for (int64_t i = i0; i < i1; ++i) {
    T* orow = op + (task * L.lq + i) * dv;
    const int64_t e = am::key_end(i, L.lq, kv_len, L.causal, L.has_lengths);
    simd_widen(qp + off.q + i * L.q_row, d, qb.data());
    sb.resize(static_cast<size_t>(std::max<int64_t>(e, 1)));
    float m = -INFINITY;
    bool any_nan = false;
    for (int64_t j = 0; j < e; ++j) {
      float x = simd_dot(qb.data(), kp + off.k + j * L.k_row, d) * scale;
      if (mp) {
        const int64_t idx = off.m + i * L.m_row + j * L.m_col;
        if (L.mask == am::MaskKind::Bool) {
          if (!reinterpret_cast<const bool*>(mp)[idx]) x = -INFINITY;
        } else {
          x += reinterpret_cast<const float*>(mp)[idx];
        }
      }
      sb[static_cast<size_t>(j)] = x;
      if (x > m) m = x;
      any_nan |= std::isnan(x);
    }
    if (m == -INFINITY && !any_nan) {
      for (int64_t c = 0; c < dv; ++c) orow[c] = convert<T>(0.0f);
      continue;
    }
    float* acc = ob.data();
    std::fill(acc, acc + dv, 0.f);
    float sum = 0.f;
    for (int64_t j = 0; j < e; ++j) {
      const float p = std::exp(sb[static_cast<size_t>(j)] - m);
      sum += p;
      if (p == 0.f) continue;  // exp(-inf): a masked key contributes nothing, even an inf value
      simd_widen(vp + off.v + j * L.v_row, dv, vb.data());
      const float* v = vb.data();
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) acc[c] += p * v[c];
    }
    const float inv = 1.f / sum;
    for (int64_t c = 0; c < dv; ++c) acc[c] *= inv;
    simd_narrow(acc, dv, orow);
  }
}

template <class T>
void attention_kernel(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      const Tensor& lengths, const am::Layout& L, double scale) {
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  const char* mp = L.mask == am::MaskKind::None ? nullptr : static_cast<const char*>(mask.data_ptr());
  const int32_t* lens = L.has_lengths ? lengths.data<const int32_t>() : nullptr;
  T* op = out.data<T>();
  const int64_t blocks = (L.lq + kRowBlock - 1) / kRowBlock;
  const int64_t work = L.outer * L.heads * blocks;
  const double flops = static_cast<double>(L.outer * L.heads) * L.lq * L.lkv * (L.d + L.dv);
  const double ninf = -std::numeric_limits<double>::infinity();

  auto mask_value = [&](int64_t idx) -> double {
    switch (L.mask) {
      case am::MaskKind::Bool: return reinterpret_cast<const bool*>(mp)[idx] ? 0.0 : ninf;
      case am::MaskKind::F32: return reinterpret_cast<const float*>(mp)[idx];
      case am::MaskKind::F64: return reinterpret_cast<const double*>(mp)[idx];
      default: return 0.0;
    }
  };

  // Contiguous channels (caches, projections): rows are read in place. Otherwise each work item gathers
  // the keys and values it sees into f64 buffers once.
  const bool direct = L.k_col == 1 && L.v_col == 1;
  // 16-bit inputs (without an f64 mask) take BLAS for blocks of at least 8 rows (prefill; block_f32).
  constexpr bool k16 = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;
  const bool blas_rows = k16 && direct && L.q_col == 1 && L.mask != am::MaskKind::F64;
  // BLAS is called from every thread of the region below: the OpenMP build of OpenBLAS then runs each call
  // on its caller's thread by itself; another build's pool is held to one thread meanwhile.
  const bool hold_pool = blas_rows && openblas_get_parallel() != 2;
  const int blas_threads = hold_pool ? openblas_get_num_threads() : 0;
  if (hold_pool) openblas_set_num_threads(1);
#pragma omp parallel if (flops > 1e5 && work > 1)
  {
    std::vector<double> kbuf, vbuf, s, qrow, acc;
    std::vector<float> qb, kb, vb, sb, ob;
#pragma omp for schedule(dynamic)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t task = w / blocks, blk = w % blocks;
      const int64_t o = task / L.heads, h = task % L.heads;
      const am::Offsets off = am::batch_offsets(L, o, h);
      const int64_t kv_len = lens ? lens[o] : L.lkv;
      const int64_t i0 = blk * kRowBlock, i1 = std::min(L.lq, i0 + kRowBlock);
      // key_end grows with i, so the last row of the block sees the most keys.
      const int64_t nk = am::key_end(i1 - 1, L.lq, kv_len, L.causal, L.has_lengths);
      if constexpr (k16) {
        if (blas_rows && i1 - i0 >= 8 &&
            block_f32(op, qp, kp, vp, mp, L, off, task, i0, i1, kv_len, nk, static_cast<float>(scale), qb, kb, vb,
                      sb, ob))
          continue;
        if (blas_rows && i1 - i0 < 8) {
          rows_f32(op, qp, kp, vp, mp, L, off, task, i0, i1, kv_len, static_cast<float>(scale), qb, sb, vb, ob);
          continue;
        }
      }
      s.resize(static_cast<size_t>(nk));
      qrow.resize(static_cast<size_t>(L.d));
      acc.resize(static_cast<size_t>(L.dv));
      if (!direct) {
        kbuf.resize(static_cast<size_t>(nk * L.d));
        vbuf.resize(static_cast<size_t>(nk * L.dv));
        for (int64_t j = 0; j < nk; ++j) {
          for (int64_t c = 0; c < L.d; ++c)
            kbuf[j * L.d + c] = convert<double>(kp[off.k + j * L.k_row + c * L.k_col]);
          for (int64_t c = 0; c < L.dv; ++c)
            vbuf[j * L.dv + c] = convert<double>(vp[off.v + j * L.v_row + c * L.v_col]);
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        T* orow = op + (task * L.lq + i) * L.dv;
        const int64_t e = am::key_end(i, L.lq, kv_len, L.causal, L.has_lengths);
        for (int64_t c = 0; c < L.d; ++c) qrow[c] = convert<double>(qp[off.q + i * L.q_row + c * L.q_col]);
        double m = ninf;
        for (int64_t j = 0; j < e; ++j) {
          const double dot = direct ? simd_dot(qrow.data(), kp + off.k + j * L.k_row, L.d)
                                    : simd_dot(qrow.data(), kbuf.data() + j * L.d, L.d);
          double x = dot * scale;
          if (mp) x += mask_value(off.m + i * L.m_row + j * L.m_col);
          s[j] = x;
          if (x > m) m = x;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        // No key to attend (all masked, or none there): 0, as PyTorch's _safe_softmax. A NaN score keeps
        // m finite or -inf and turns the row into NaN below, as in PyTorch.
        bool any_nan = false;
        for (int64_t j = 0; j < e; ++j) any_nan |= std::isnan(s[j]);
        if (m == ninf && !any_nan) {
          for (int64_t c = 0; c < L.dv; ++c) orow[c] = convert<T>(0.0);
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < e; ++j) {
          const double p = std::exp(s[j] - m);
          sum += p;
          if (p == 0.0) continue;  // exp(-inf): a masked key contributes nothing, even an inf value
          if (direct) axpy_f64(acc.data(), p, vp + off.v + j * L.v_row, L.dv);
          else axpy_f64(acc.data(), p, vbuf.data() + j * L.dv, L.dv);
        }
        for (int64_t c = 0; c < L.dv; ++c) orow[c] = convert<T>(acc[c] / sum);
      }
    }
  }
  if (hold_pool) openblas_set_num_threads(blas_threads);
}

}  // namespace

void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
               const Tensor& lengths, const attention_math::Layout& L, double scale) {
  if (out.numel() == 0) return;
  visit_dtypes<kFloatTypes>(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    attention_kernel<T>(out, q, k, v, mask, lengths, L, scale);
  });
}

}  // namespace kiln::cpu
