// attnhub CUDA backend: tensor-core backward for float16 / bfloat16 (sm_80+), head dims 64 / 128.
// Fused (default): attn_bwd_fused_mma is attn_bwd_dkdv_mma that also stages dS in shared memory and
//   adds its dQ share (dS K, 64 queries x Dqk per step) into a float32 buffer with atomics;
//   attn_bwd_dq_convert scales and rounds that buffer. Five matrix products per tile pair instead of
//   the split pair's seven; the order of the atomic adds makes dQ non-deterministic in its last bits.
// Split (ATTNHUB_CUDA_BWD=split): two deterministic kernels (no atomics), P recomputed from lse:
//   attn_bwd_dkdv_mma: one block per (64-key tile, kv head, batch); each warp owns 16 keys and walks
//     every query head of its GQA group and every query tile that is not fully masked (Q, dO tiles
//     double-buffered with cp.async): S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
//   attn_bwd_dq_mma: one block per (64-query tile, head, batch), walking key tiles like the forward:
//     S = Q K^T, dP = dO V^T, dQ += dS K.
// delta = rowsum(dO * O) comes from attn_bwd_pre (bwd_simt.cu). Parameters: ATT_DTYPE, DQK, DV.

#ifndef KRB
#define KRB 1     // 16-key row blocks per warp in dK/dV (2: each Q / dO fragment read feeds two)
#endif
#ifndef NWK
#define NWK 4     // warps of the dK/dV and fused kernels (the host sets it: compiler.bwd_warps)
#endif
#define KB_N (16 * NWK * KRB)  // keys per dK/dV block
#ifndef KB_Q
#define KB_Q 64   // query rows per dK/dV step (the host sets it: compiler.BWD_STEPS)
#endif
#define QB_M 64   // queries per dQ block
#ifndef QB_N
#define QB_N 64   // keys per dQ step (the host sets it)
#endif
#define BW_NT (32 * NWK)  // threads of the dK/dV and fused kernels
#define DQ_NT 128          // threads of the dQ kernel (4 warps x 16 queries)

template <bool FUSED>
__device__ __forceinline__ void dkdv_body(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dqacc, int Hq, int Hkv, int Nq, int Nk,
    float scale, float scale_log2, int tile_major, const Mask& m) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // KB_N x DQK
  T* sV = sK + KB_N * DQK;                  // KB_N x DV
  T* sQ = sV + KB_N * DV;                   // 2 x KB_Q x DQK
  T* sO = sQ + 2 * KB_Q * DQK;              // 2 x KB_Q x DV (dO)
  float* sL = reinterpret_cast<float*>(sO + 2 * KB_Q * DV);  // 2 x KB_Q (lse, log2 domain)
  float* sD = sL + 2 * KB_Q;                                 // 2 x KB_Q (delta)
  T* sS = reinterpret_cast<T*>(sD + 2 * KB_Q);              // KB_N x KB_Q (dS, fused only)
  const float INF = __int_as_float(0x7f800000);

  // Grid as the forward's: (kv heads, batch, key tiles) when tile_major (the first key tiles, under
  // causal rules the heaviest, start first), else (key tiles, kv heads, batch).
  const GridPos pos(tile_major);
  const int kt = pos.tile, hk = pos.head, b = pos.batch;
  const int group = Hq / Hkv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int k0 = kt * KB_N, k1 = min(k0 + KB_N, Nk) - 1;
  const i64 kvbase = ((i64)b * Hkv + hk) * Nk;

  load_tile<KB_N, DQK, BW_NT>(sK, k + kvbase * DQK, DQK, k0, Nk, tid);
  load_tile<KB_N, DV, BW_NT>(sV, v + kvbase * DV, DV, k0, Nk, tid);

  // This warp's keys: KRB blocks of 16; block rb holds rows kb + 16 rb + g and + 8.
  const int kb = k0 + warp * KRB * 16;
  const int arow = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix row of an A fragment
  const u32 sKA = smem_u32(sK) + 2 * warp * KRB * 16 * DQK, sVA = smem_u32(sV) + 2 * warp * KRB * 16 * DV;
  const u32 ka_off = 2 * swz<DQK>(arow, lane >> 4), va_off = 2 * swz<DV>(arow, lane >> 4);
  const u32 qb_off = 2 * swz<DQK>(lane & 7, lane >> 3), ob_off = 2 * swz<DV>(lane & 7, lane >> 3);
  const u32 qt_off = 2 * swz<DQK>(arow, lane >> 4), ot_off = 2 * swz<DV>(arow, lane >> 4);

  float dka[KRB][DQK / 8][4], dva[KRB][DV / 8][4];
#pragma unroll
  for (int rb = 0; rb < KRB; ++rb) {
#pragma unroll
    for (int i = 0; i < DQK / 8; ++i) dka[rb][i][0] = dka[rb][i][1] = dka[rb][i][2] = dka[rb][i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) dva[rb][i][0] = dva[rb][i][1] = dva[rb][i][2] = dva[rb][i][3] = 0.f;
  }

  const int nqt = (Nq + KB_Q - 1) / KB_Q;
  const int total = group * nqt;  // (query head of the group, query tile) pairs
  const TileClasses<false> classes(m, k0, k1, Nq, Nk);
  auto tile_class = [&](int q0) { return classes(q0, min(q0 + KB_Q, Nq) - 1); };
  auto live = [&](int it) { return tile_class((it % nqt) * KB_Q) != 0; };
  auto issue = [&](int it, int bf) {
    const int h = hk * group + it / nqt, q0 = (it % nqt) * KB_Q;
    const i64 qbase = ((i64)b * Hq + h) * Nq;
    load_tile<KB_Q, DQK, BW_NT>(sQ + bf * KB_Q * DQK, q + qbase * DQK, DQK, q0, Nq, tid);
    load_tile<KB_Q, DV, BW_NT>(sO + bf * KB_Q * DV, dout + qbase * DV, DV, q0, Nq, tid);
    if (tid < KB_Q) {
      const int r = q0 + tid;
      const bool in = r < Nq;
      sL[bf * KB_Q + tid] = in ? lse2_of(lse[qbase + r]) : INF;
      sD[bf * KB_Q + tid] = in ? delta[qbase + r] : 0.f;
    }
  };

  int it = 0;
  while (it < total && !live(it)) ++it;
  if (it < total) issue(it, 0);
  cp_async_commit();
  int buf = 0;
  while (it < total) {
    int nx = it + 1;
    while (nx < total && !live(nx)) ++nx;
    if (nx < total) issue(nx, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int q0 = (it % nqt) * KB_Q;
    const int cls = tile_class(q0);
    const T* sQb = sQ + buf * KB_Q * DQK;
    const T* sOb = sO + buf * KB_Q * DV;
    const float* sLb = sL + buf * KB_Q;
    const float* sDb = sD + buf * KB_Q;
    // ldmatrix addresses as base + XOR / add constants (see fwd_mma.cu): a lane's offsets at chunk 0.
    const u32 qbA = smem_u32(sQb), obA = smem_u32(sOb);

    // S^T = K_w Q^T and dP^T = V_w dO^T: KRB x 16 keys x KB_Q queries each; every Q / dO fragment
    // read feeds KRB row blocks.
    float st[KRB][KB_Q / 8][4], dpt[KRB][KB_Q / 8][4];
#pragma unroll
    for (int rb = 0; rb < KRB; ++rb)
#pragma unroll
      for (int nt = 0; nt < KB_Q / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[rb][nt][e] = dpt[rb][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk += 2) {
      u32 a0[KRB][4], a1[KRB][4];
#pragma unroll
      for (int rb = 0; rb < KRB; ++rb) {
        ldsm_x4_a(a0[rb], sKA + rb * (16 * DQK * 2) + (ka_off ^ ((kk * 2) << 4)));
        ldsm_x4_a(a1[rb], sKA + rb * (16 * DQK * 2) + (ka_off ^ ((kk * 2 + 2) << 4)));
      }
#pragma unroll
      for (int nt = 0; nt < KB_Q / 8; ++nt) {
        u32 bf[4];
        ldsm_x4_a(bf, qbA + (qb_off ^ ((kk * 2) << 4)) + nt * (8 * DQK * 2));
#pragma unroll
        for (int rb = 0; rb < KRB; ++rb) {
          mma16816(st[rb][nt], a0[rb], bf[0], bf[1]);
          mma16816(st[rb][nt], a1[rb], bf[2], bf[3]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < DV / 16; kk += 2) {
      u32 a0[KRB][4], a1[KRB][4];
#pragma unroll
      for (int rb = 0; rb < KRB; ++rb) {
        ldsm_x4_a(a0[rb], sVA + rb * (16 * DV * 2) + (va_off ^ ((kk * 2) << 4)));
        ldsm_x4_a(a1[rb], sVA + rb * (16 * DV * 2) + (va_off ^ ((kk * 2 + 2) << 4)));
      }
#pragma unroll
      for (int nt = 0; nt < KB_Q / 8; ++nt) {
        u32 bf[4];
        ldsm_x4_a(bf, obA + (ob_off ^ ((kk * 2) << 4)) + nt * (8 * DV * 2));
#pragma unroll
        for (int rb = 0; rb < KRB; ++rb) {
          mma16816(dpt[rb][nt], a0[rb], bf[0], bf[1]);
          mma16816(dpt[rb][nt], a1[rb], bf[2], bf[3]);
        }
      }
    }

#pragma unroll
    for (int rb = 0; rb < KRB; ++rb)
      bwd_p_ds<KB_Q / 8>(m, classes, cls, kb + rb * 16 + g, q0, Nq, Nk, t4, sLb, sDb, st[rb], dpt[rb], scale_log2);

    if constexpr (FUSED) {
      // dS^T rows (this warp's keys) into sS, swizzled like the tiles; keys past Nk hold 0.
#pragma unroll
      for (int rb = 0; rb < KRB; ++rb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int kl = warp * KRB * 16 + rb * 16 + g + 8 * r;
          const bool in = k0 + kl < Nk;
#pragma unroll
          for (int nt = 0; nt < KB_Q / 8; ++nt)
            *reinterpret_cast<u32*>(sS + swz<KB_Q>(kl, nt) + 2 * t4) =
                in ? pack2(dpt[rb][nt][2 * r], dpt[rb][nt][2 * r + 1]) : 0u;
        }
    }

    // dV += P^T dO and dK += dS^T Q (the k dimension is the KB_Q queries); every dO / Q fragment
    // read feeds KRB row blocks.
#pragma unroll
    for (int kk = 0; kk < KB_Q / 16; ++kk) {
      u32 ap[KRB][4], as[KRB][4];
#pragma unroll
      for (int rb = 0; rb < KRB; ++rb) {
        ap[rb][0] = pack2(st[rb][2 * kk][0], st[rb][2 * kk][1]);
        ap[rb][1] = pack2(st[rb][2 * kk][2], st[rb][2 * kk][3]);
        ap[rb][2] = pack2(st[rb][2 * kk + 1][0], st[rb][2 * kk + 1][1]);
        ap[rb][3] = pack2(st[rb][2 * kk + 1][2], st[rb][2 * kk + 1][3]);
        as[rb][0] = pack2(dpt[rb][2 * kk][0], dpt[rb][2 * kk][1]);
        as[rb][1] = pack2(dpt[rb][2 * kk][2], dpt[rb][2 * kk][3]);
        as[rb][2] = pack2(dpt[rb][2 * kk + 1][0], dpt[rb][2 * kk + 1][1]);
        as[rb][3] = pack2(dpt[rb][2 * kk + 1][2], dpt[rb][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dt = 0; dt < DV / 8; dt += 2) {
        u32 bf[4];
        ldsm_x4_t_a(bf, obA + kk * (16 * DV * 2) + (ot_off ^ (dt << 4)));
#pragma unroll
        for (int rb = 0; rb < KRB; ++rb) {
          mma16816(dva[rb][dt], ap[rb], bf[0], bf[1]);
          mma16816(dva[rb][dt + 1], ap[rb], bf[2], bf[3]);
        }
      }
#pragma unroll
      for (int dt = 0; dt < DQK / 8; dt += 2) {
        u32 bf[4];
        ldsm_x4_t_a(bf, qbA + kk * (16 * DQK * 2) + (qt_off ^ (dt << 4)));
#pragma unroll
        for (int rb = 0; rb < KRB; ++rb) {
          mma16816(dka[rb][dt], as[rb], bf[0], bf[1]);
          mma16816(dka[rb][dt + 1], as[rb], bf[2], bf[3]);
        }
      }
    }
    if constexpr (FUSED) {
      __syncthreads();  // sS complete
      // dQ[q0 + 16 warp .. + 15] += dS K over the KB_N keys: A = dS (queries x keys) read transposed
      // from sS, B = K from sK as in attn_bwd_dq_mma; added to dqacc in chunks of 4 column blocks.
      // Warp w: queries 16 (w % 4) .. + 15 of the step, column blocks [cw0, cw0 + CWN) of dQ.
      constexpr int CWN = DQK / 8 / (NWK / 4);
      const int rg = warp & 3, cw0 = (warp >> 2) * CWN;
      const int h = hk * group + it / nqt;
      const i64 qrow = ((i64)b * Hq + h) * Nq + q0 + rg * 16 + g;
      const int qr = q0 + rg * 16 + g;
      const int mat = lane >> 3, mr = lane & 7;
      const u32 sSA = smem_u32(sS);
      u32 af[KB_N / 16][4];
#pragma unroll
      for (int kk = 0; kk < KB_N / 16; ++kk)
        ldsm_x4_t_a(af[kk], sSA + 2 * swz<KB_Q>(kk * 16 + (mat >> 1) * 8 + mr, 2 * rg + (mat & 1)));
      const u32 sKA0 = smem_u32(sK);
      const u32 kt_off = 2 * swz<DQK>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#pragma unroll
      for (int dc = cw0; dc < cw0 + CWN; dc += 4) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KB_N / 16; ++kk)
#pragma unroll
          for (int dt = 0; dt < 4; dt += 2) {
            u32 bf[4];
            ldsm_x4_t_a(bf, sKA0 + kk * (16 * DQK * 2) + (kt_off ^ ((dc + dt) << 4)));
            mma16816(acc[dt], af[kk], bf[0], bf[1]);
            mma16816(acc[dt + 1], af[kk], bf[2], bf[3]);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (qr + 8 * r >= Nq) continue;
          float* dst = dqacc + (qrow + 8 * r) * DQK + dc * 8 + 2 * t4;
#pragma unroll
          for (int i = 0; i < 4; ++i) red_add2(dst + i * 8, acc[i][2 * r], acc[i][2 * r + 1]);
        }
      }
    }
    __syncthreads();
    buf ^= 1;
    it = nx;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int rb = 0; rb < KRB; ++rb)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = kb + rb * 16 + g + 8 * r;
      if (key >= Nk) continue;
      T* dkr = dk + (kvbase + key) * DQK;
      T* dvr = dv + (kvbase + key) * DV;
#pragma unroll
      for (int dt = 0; dt < DQK / 8; ++dt)
        *reinterpret_cast<u32*>(dkr + dt * 8 + 2 * t4) =
            pack2(dka[rb][dt][2 * r] * scale, dka[rb][dt][2 * r + 1] * scale);
#pragma unroll
      for (int dt = 0; dt < DV / 8; ++dt)
        *reinterpret_cast<u32*>(dvr + dt * 8 + 2 * t4) = pack2(dva[rb][dt][2 * r], dva[rb][dt][2 * r + 1]);
    }
}

extern "C" __global__ void __launch_bounds__(BW_NT) attn_bwd_dkdv_mma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    T* __restrict__ dk, T* __restrict__ dv, int Hq, int Hkv, int Nq, int Nk, float scale,
    float scale_log2, int tile_major, MASK_PARAMS) {
  const Mask m = MASK_INIT;
  dkdv_body<false>(q, k, v, dout, lse, delta, dk, dv, nullptr, Hq, Hkv, Nq, Nk, scale, scale_log2,
                   tile_major, m);
}

#if KB_Q == 64
// dK, dV as attn_bwd_dkdv_mma, plus dQ's unscaled share added into dqacc (float32, zeroed first).
extern "C" __global__ void __launch_bounds__(BW_NT) attn_bwd_fused_mma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dqacc, int Hq, int Hkv, int Nq, int Nk,
    float scale, float scale_log2, int tile_major, MASK_PARAMS) {
  const Mask m = MASK_INIT;
  dkdv_body<true>(q, k, v, dout, lse, delta, dk, dv, dqacc, Hq, Hkv, Nq, Nk, scale, scale_log2,
                  tile_major, m);
}
#endif

extern "C" __global__ void __launch_bounds__(DQ_NT) attn_bwd_dq_mma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    T* __restrict__ dq, int Hq, int group, int Nq, int Nk, float scale, float scale_log2, int tile_major,
    MASK_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // QB_M x DQK
  T* sO = sQ + QB_M * DQK;                  // QB_M x DV (dO)
  T* sK = sO + QB_M * DV;                   // 2 x QB_N x DQK
  T* sV = sK + 2 * QB_N * DQK;              // 2 x QB_N x DV
  const Mask m = MASK_INIT;
  const float INF = __int_as_float(0x7f800000);

  const int ntq = (Nq + QB_M - 1) / QB_M;
  const GridPos pos(tile_major);  // grid as the forward's
  const int qi = pos.tile, h = pos.head, b = pos.batch;
  const int qt = ntq - 1 - qi, hk = h / group, Hkv = Hq / group;
  const i64 qbase = ((i64)b * Hq + h) * Nq;
  const i64 kvbase = ((i64)b * Hkv + hk) * Nk;
  const T* kp = k + kvbase * DQK;
  const T* vp = v + kvbase * DV;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int q0 = qt * QB_M, q1 = min(q0 + QB_M, Nq) - 1;
  const int nkt = (Nk + QB_N - 1) / QB_N;
  const KeyTiles<QB_N> tiles(m, q0, q1, Nq, Nk);

  load_tile<QB_M, DQK, DQ_NT>(sQ, q + qbase * DQK, DQK, q0, Nq, tid);
  load_tile<QB_M, DV, DQ_NT>(sO, dout + qbase * DV, DV, q0, Nq, tid);
  int j = tiles.live(0);
  if (j < nkt) {
    load_tile<QB_N, DQK, DQ_NT>(sK, kp, DQK, j * QB_N, Nk, tid);
    load_tile<QB_N, DV, DQ_NT>(sV, vp, DV, j * QB_N, Nk, tid);
  }
  cp_async_commit();

  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  float lr[2], dr[2];
  lr[0] = r0 < Nq ? lse2_of(lse[qbase + r0]) : INF;
  lr[1] = r1 < Nq ? lse2_of(lse[qbase + r1]) : INF;
  dr[0] = r0 < Nq ? delta[qbase + r0] : 0.f;
  dr[1] = r1 < Nq ? delta[qbase + r1] : 0.f;

  const u32 sKA = smem_u32(sK), sVA = smem_u32(sV);
  const u32 kb_off = 2 * swz<DQK>(lane & 7, lane >> 3), vb_off = 2 * swz<DV>(lane & 7, lane >> 3);
  const u32 kt_off = 2 * swz<DQK>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
  float dqa[DQK / 8][4];
#pragma unroll
  for (int i = 0; i < DQK / 8; ++i) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;
  u32 qf[DQK / 16][4], of[DV / 16][4];
  bool have = false;
  int buf = 0;
  while (j < nkt) {
    const int jn = tiles.live(j + 1);
    if (jn < nkt) {
      load_tile<QB_N, DQK, DQ_NT>(sK + (buf ^ 1) * QB_N * DQK, kp, DQK, jn * QB_N, Nk, tid);
      load_tile<QB_N, DV, DQ_NT>(sV + (buf ^ 1) * QB_N * DV, vp, DV, jn * QB_N, Nk, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (!have) {
      const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk) ldsm_x4(qf[kk], sQ + swz<DQK>(row, kk * 2 + (lane >> 4)));
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk) ldsm_x4(of[kk], sO + swz<DV>(row, kk * 2 + (lane >> 4)));
      have = true;
    }
    const u32 kbA = sKA + buf * (QB_N * DQK * 2), vbA = sVA + buf * (QB_N * DV * 2);
    float s[QB_N / 8][4], dp[QB_N / 8][4];
#pragma unroll
    for (int nt = 0; nt < QB_N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk += 2)
#pragma unroll
      for (int nt = 0; nt < QB_N / 8; ++nt) {
        u32 bf[4];
        ldsm_x4_a(bf, kbA + (kb_off ^ ((kk * 2) << 4)) + nt * (8 * DQK * 2));
        mma16816(s[nt], qf[kk], bf[0], bf[1]);
        mma16816(s[nt], qf[kk + 1], bf[2], bf[3]);
      }
#pragma unroll
    for (int kk = 0; kk < DV / 16; kk += 2)
#pragma unroll
      for (int nt = 0; nt < QB_N / 8; ++nt) {
        u32 bf[4];
        ldsm_x4_a(bf, vbA + (vb_off ^ ((kk * 2) << 4)) + nt * (8 * DV * 2));
        mma16816(dp[nt], of[kk], bf[0], bf[1]);
        mma16816(dp[nt], of[kk + 1], bf[2], bf[3]);
      }

    const int k0 = j * QB_N;
    const int cls = tiles.cls(j);
    u32 keep0 = 0xffffffffu, keep1 = 0xffffffffu;
    if ((cls != 2 || k0 + QB_N > Nk) && m.one_interval(Nq, Nk)) {
      int lo[2], hi[2];
      m.key_interval(min(r0, Nq - 1), Nk, lo[0], hi[0]);
      m.key_interval(min(r1, Nq - 1), Nk, lo[1], hi[1]);
      keep0 = keep1 = 0;
#pragma unroll
      for (int c = 0; c < QB_N / 4; ++c) {
        const int kn = k0 + (c >> 1) * 8 + 2 * t4 + (c & 1);
        keep0 |= (u32)(kn >= lo[0] && kn <= hi[0]) << c;
        keep1 |= (u32)(kn >= lo[1] && kn <= hi[1]) << c;
      }
    } else if (cls != 2 || k0 + QB_N > Nk) {
      rule_keep_bits<QB_N / 8>(m, r0, k0, Nq, Nk, t4, keep0, keep1);
    }
#pragma unroll
    for (int nt = 0; nt < QB_N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const u32 kb = r ? keep1 : keep0;
          const float p = ((kb >> (2 * nt + e)) & 1u) ? fast_exp2(s[nt][2 * r + e] * scale_log2 - lr[r]) : 0.f;
          s[nt][2 * r + e] = p * (dp[nt][2 * r + e] - dr[r]);  // dS
        }

    // dQ += dS K (k dimension: the QB_N keys)
#pragma unroll
    for (int kk = 0; kk < QB_N / 16; ++kk) {
      u32 a[4];
      a[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dt = 0; dt < DQK / 8; dt += 2) {
        u32 bf[4];
        ldsm_x4_t_a(bf, kbA + kk * (16 * DQK * 2) + (kt_off ^ (dt << 4)));
        mma16816(dqa[dt], a, bf[0], bf[1]);
        mma16816(dqa[dt + 1], a, bf[2], bf[3]);
      }
    }
    __syncthreads();
    buf ^= 1;
    j = jn;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r ? r1 : r0;
    if (row >= Nq) continue;
    T* dqr = dq + (qbase + row) * DQK;
#pragma unroll
    for (int dt = 0; dt < DQK / 8; ++dt)
      *reinterpret_cast<u32*>(dqr + dt * 8 + 2 * t4) = pack2(dqa[dt][2 * r] * scale, dqa[dt][2 * r + 1] * scale);
  }
}
