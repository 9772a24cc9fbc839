// attnhub CUDA backend: the softmax stages of the tensor-core kernels, on accumulator fragments.
// A warp's fragment of 16 rows x 8 NB columns is float s[NB][4]: lane (g = lane / 4, t4 = lane % 4)
// holds rows g (s[nt][0], s[nt][1]) and g + 8 (s[nt][2], s[nt][3]) at columns 8 nt + 2 t4 and + 1.
// mma.sync (m16n8) and wgmma (each warp's 16 rows of m64nN) accumulators both have this layout, so
// the mma.sync and wgmma kernels share these functions.
#pragma once

#ifndef SCALE_POS
#define SCALE_POS 0  // 1: the host guarantees scale > 0 (the scale is then fused into exp2's FFMA)
#endif

// Rule mask of one warp's rows row0 and row0 + 8 against the keys of NB 8-key blocks from k0: bit
// (2 nt + e) of keep[r] says row r attends key k0 + 8 nt + 2 t4 + e (keys past Nk: 0). The rule is
// evaluated from positions in a rolled loop (one copy of the code); rows past Nq are clamped.
template <int NB>
__device__ __forceinline__ void rule_keep_bits(const Mask& m, int row0, int k0, int Nq, int Nk, int t4, u32& keep0,
                                               u32& keep1) {
  int qy[2], qx[2];
  i64 fq[2];
  m.qpos(min(row0, Nq - 1), qy[0], qx[0], fq[0]);
  m.qpos(min(row0 + 8, Nq - 1), qy[1], qx[1], fq[1]);
  keep0 = keep1 = 0;
#pragma unroll 1
  for (int c = 0; c < 2 * NB; ++c) {
    int kn = k0 + (c >> 1) * 8 + 2 * t4 + (c & 1);
    if (kn < Nk) {
      int ky, kx;
      i64 fk;
      m.kpos(kn, ky, kx, fk);
      keep0 |= (u32)m.attend(qy[0], qx[0], fq[0], ky, kx, fk) << c;
      keep1 |= (u32)m.attend(qy[1], qx[1], fq[1], ky, kx, fk) << c;
    }
  }
}

// Forward, one warp's rows row0 and row0 + 8 against keys k0 ..: scale the logits into the log2
// domain (before the max unless SCALE_POS), mask what the rule does not attend (masked tiles only),
// and take the online-softmax step: s becomes P (unnormalised), mrow / lrow the rows' running max
// and sum, alpha the factor for the output accumulators. Rows past Nq are clamped (never stored).
template <int NB>
__device__ __forceinline__ void fwd_softmax_step(const Mask& m, float (*s)[4], int row0, int k0, int Nq, int Nk,
                                                 int t4, bool masked, float* mrow, float* lrow, float* alpha,
                                                 float scale_log2) {
#if !SCALE_POS
  // Scale into the log2 domain first (a non-positive scale reverses or flattens the order).
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
#endif
  if (masked && m.one_interval(Nq, Nk)) {
    // Each row attends one interval of keys: two compares per element.
    int lo[2], hi[2];
    m.key_interval(min(row0, Nq - 1), Nk, lo[0], hi[0]);
    m.key_interval(min(row0 + 8, Nq - 1), Nk, lo[1], hi[1]);
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kn = k0 + nt * 8 + 2 * t4 + (e & 1);
        if (kn < lo[e >> 1] || kn > hi[e >> 1]) s[nt][e] = ATT_NEG_INF;
      }
  } else if (masked) {
    // Rule bits in a rolled loop, then applied with constant indices.
    u32 keep0, keep1;
    rule_keep_bits<NB>(m, row0, k0, Nq, Nk, t4, keep0, keep1);
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!((keep0 >> (2 * nt + e)) & 1u)) s[nt][e] = ATT_NEG_INF;
        if (!((keep1 >> (2 * nt + e)) & 1u)) s[nt][2 + e] = ATT_NEG_INF;
      }
  }

  // Online softmax; row r lives in s[*][2r], s[*][2r+1] across the quad.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#if SCALE_POS
    // Raw logits: max first, then one FFMA per element folds the scale into exp2's argument.
    float mx_ = ATT_NEG_INF;
#else
    float mx_ = mrow[r];
#endif
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) mx_ = fmaxf(mx_, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx_ = fmaxf(mx_, __shfl_xor_sync(0xffffffff, mx_, 1));
    mx_ = fmaxf(mx_, __shfl_xor_sync(0xffffffff, mx_, 2));
#if SCALE_POS
    mx_ = fmaxf(mrow[r], mx_ * scale_log2);
    const float sc = scale_log2;
#else
    const float sc = 1.f;
#endif
    const float mu = (mx_ == ATT_NEG_INF) ? 0.f : mx_;
    // An unchanged row max rescales by exactly 1 (the common case after the first tiles).
    alpha[r] = (mx_ == mrow[r]) ? 1.f : fast_exp2(mrow[r] - mu);
    mrow[r] = mx_;
    float rs = 0.f;
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) {
      s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], sc, -mu));
      s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], sc, -mu));
      rs += s[nt][2 * r] + s[nt][2 * r + 1];
    }
    lrow[r] = lrow[r] * alpha[r] + rs;
  }
}

#if MODS
// Score modifiers on one warp's fragment (rows row0, row0 + 8; keys from k0): the raw products
// become scale q.k in the log2 domain, softcapped and biased (SPEC §9); fwd_softmax_step then runs
// with scale 1. Rows past Nq read row Nq - 1's bias (never stored); keys past Nk none (masked).
template <int NB>
__device__ __forceinline__ void fwd_mods(const Mods<float>& md, float (*s)[4], int row0, int k0, int Nq, int Nk,
                                         int t4, float scale_log2) {
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kn = k0 + nt * 8 + 2 * t4 + (e & 1);
      float u = s[nt][e] * scale_log2, th;
      if (kn < Nk) u = md.apply(u, min(row0 + 8 * (e >> 1), Nq - 1), kn, th);
      s[nt][e] = u;
    }
}
#endif

// Forward start: NRB row blocks of two rows each (mrow / lrow index 2 rb + r) with no key seen yet
// (m = -inf, l = 0) and their NB 8-column output accumulators zeroed.
template <int NRB, int NB>
__device__ __forceinline__ void fwd_init_rows(float* mrow, float* lrow, float (*oacc)[NB][4]) {
#pragma unroll
  for (int rb = 0; rb < NRB; ++rb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mrow[2 * rb + r] = ATT_NEG_INF;
      lrow[2 * rb + r] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < NB; ++i) oacc[rb][i][0] = oacc[rb][i][1] = oacc[rb][i][2] = oacc[rb][i][3] = 0.f;
  }
}

// Stores a pair of adjacent output values: float32, or packed in the 16-bit input type (pack2).
__device__ __forceinline__ void store_pair(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
template <typename H>
__device__ __forceinline__ void store_pair(H* p, float a, float b) {
  *reinterpret_cast<u32*>(p) = pack2(a, b);
}

// Forward epilogue, one warp's rows row0 and row0 + 8 of NB 8-column blocks: the row sums l are
// completed across the quad, the accumulators scaled by post / l and stored with the natural-log
// lse (mrow is in the log2 domain); a row with no attended key gets out = 0 and lse = -inf. Rows
// past Nq are not stored. op and lp point at the (batch, head)'s first row.
template <int NB, typename OutT>
__device__ __forceinline__ void fwd_store_rows(const float (*acc)[4], const float* lrow, const float* mrow, OutT* op,
                                               float* lp, int row0, int Nq, int t4, float post = 1.f) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = lrow[r];
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    const float inv = (l == 0.f) ? 0.f : post / l;
    const int row = row0 + 8 * r;
    if (row < Nq) {
      OutT* orow = op + (i64)row * (NB * 8);
#pragma unroll
      for (int dt = 0; dt < NB; ++dt) store_pair(orow + dt * 8 + 2 * t4, acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
      if (t4 == 0) lp[row] = (l == 0.f) ? ATT_NEG_INF : (mrow[r] + log2f(l)) * 0.6931471805599453f;
    }
  }
}

// Backward, one warp's key rows kr0 and kr0 + 8 (rows of S^T, dP^T) against queries q0 ..: st
// becomes P = exp2(S scale_log2 - lse) where the rule attends the pair (else 0) and dpt becomes
// dS = P (dP - delta); lse (log2 domain) and delta of the step's queries are read from sL, sD.
// cls: the tile's class (2: every pair attended, no rule evaluation).
template <int NB>
__device__ __forceinline__ void bwd_p_ds(const Mask& m, const TileClasses<false>& classes, int cls, int kr0,
                                         int q0, int Nq, int Nk, int t4, const float* sL, const float* sD,
                                         float (*st)[4], float (*dpt)[4], float scale_log2
#if MODS
                                         , const Mods<float>& md
#endif
) {
  // Rule mask: bit (2 nt + e) of keep[r] says key row r attends query q0 + 8 nt + 2 t4 + e.
  const int kr1 = kr0 + 8;
  u32 keep0 = 0xffffffffu, keep1 = 0xffffffffu;
  if (cls != 2 && classes.iv) {
    // Each key row is attended by one interval of queries: two compares per element.
    int lo[2], hi[2];
    m.query_interval(min(kr0, Nk - 1), Nq, lo[0], hi[0]);
    m.query_interval(min(kr1, Nk - 1), Nq, lo[1], hi[1]);
    keep0 = keep1 = 0;
#pragma unroll
    for (int c = 0; c < 2 * NB; ++c) {
      const int qn = q0 + (c >> 1) * 8 + 2 * t4 + (c & 1);
      keep0 |= (u32)(qn >= lo[0] && qn <= hi[0]) << c;
      keep1 |= (u32)(qn >= lo[1] && qn <= hi[1]) << c;
    }
  } else if (cls != 2) {
    int ky[2], kx[2];
    i64 fk[2];
    m.kpos(min(kr0, Nk - 1), ky[0], kx[0], fk[0]);
    m.kpos(min(kr1, Nk - 1), ky[1], kx[1], fk[1]);
    keep0 = keep1 = 0;
#pragma unroll 1
    for (int c = 0; c < 2 * NB; ++c) {
      const int qn = q0 + (c >> 1) * 8 + 2 * t4 + (c & 1);
      if (qn < Nq) {
        int qy, qx;
        i64 fq;
        m.qpos(qn, qy, qx, fq);
        keep0 |= (u32)m.attend(qy, qx, fq, ky[0], kx[0], fk[0]) << c;
        keep1 |= (u32)m.attend(qy, qx, fq, ky[1], kx[1], fk[1]) << c;
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = nt * 8 + 2 * t4 + e;
      const float lq = sL[col], dl = sD[col];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const u32 kp = r ? keep1 : keep0;
#if MODS
        // Modified logits (SPEC §9); dS of the scaled logit, dS of the modified one recorded for dbias.
        const int key = kr0 + 8 * r, qn = q0 + col;
        const bool in = key < Nk && qn < Nq;
        float p = 0.f, th = 0.f;
        if (in && ((kp >> (2 * nt + e)) & 1u)) p = fast_exp2(md.apply(st[nt][2 * r + e] * scale_log2, qn, key, th) - lq);
        float d = p * (dpt[nt][2 * r + e] - dl);
        if (in) d = md.grad(d, th, qn, key);
        dpt[nt][2 * r + e] = d;
#else
        const float p = ((kp >> (2 * nt + e)) & 1u) ? fast_exp2(st[nt][2 * r + e] * scale_log2 - lq) : 0.f;
        dpt[nt][2 * r + e] = p * (dpt[nt][2 * r + e] - dl);
#endif
        st[nt][2 * r + e] = p;
      }
    }
}
