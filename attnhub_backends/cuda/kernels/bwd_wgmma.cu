// attnhub CUDA backend: tensor-core backward for float16 / bfloat16 on Hopper (sm_90a), with wgmma.
// attn_bwd_fused_wgmma: one block per (KB_N-key tile, kv head, batch); warpgroup w owns keys
// 64 w .. 64 w + 63 of the tile and walks every query head of its GQA group and every query tile of
// KB_Q = 64 rows that is not fully masked (Q, dO, lse, delta double-buffered with cp.async):
//   S^T = K Q^T and dP^T = V dO^T   (wgmma, both operands in shared memory),
//   P, dS = P (dP - delta)          (registers, mask from positions: frag.cuh),
//   dV += P^T dO, dK += dS^T Q      (wgmma, A from registers),
//   dQ += dS K                      (dS staged in shared memory; warpgroup w adds columns
//                                    [w DQK / NWG, (w + 1) DQK / NWG) into a float32 buffer with
//                                    vector reductions; attn_bwd_dq_convert scales and rounds it).
// delta = rowsum(dO * O) comes from attn_bwd_pre (bwd_simt.cu). Parameters: ATT_DTYPE, DQK, DV, NWG.

#define KB_Q 64
#ifndef BWD_OVERLAP
#define BWD_OVERLAP 0  // 1: the dQ products are issued while dK / dV's are in flight (more registers)
#endif
#define KB_N (64 * NWG)
#define NT (128 * NWG)
constexpr int DQN = DQK / NWG;  // dQ columns per warpgroup
static_assert(DQK % 64 == 0 && DV % 64 == 0 && DQN % 32 == 0, "bwd wgmma: head dims and dQ columns per warpgroup");

#ifndef MINB
#define MINB 1  // blocks per SM the compiler caps registers for
#endif

extern "C" __global__ void __launch_bounds__(NT, MINB) attn_bwd_fused_wgmma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
    T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dqacc, int Hq, int Hkv, int Nq, int Nk,
    float scale, float scale_log2, int tile_major, MASK_PARAMS MOD_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // 1024-byte aligned panels (the host allocates 1 KB of slack): K, V, 2 x Q, 2 x dO, dS^T, then
  // lse (log2 domain) and delta for the two query buffers.
  const u32 sKa = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sVa = sKa + KB_N * DQK * 2;
  const u32 sQa = sVa + KB_N * DV * 2;
  const u32 sOa = sQa + 2 * KB_Q * DQK * 2;
  const u32 sSa = sOa + 2 * KB_Q * DV * 2;  // KB_N key rows x 64 queries (128 bytes), swizzled
  float* sL = reinterpret_cast<float*>(smem_raw + (sSa + KB_N * KB_Q * 2 - smem_u32(smem_raw)));
  float* sD = sL + 2 * KB_Q;
  const float INF = __int_as_float(0x7f800000);
  const Mask m = MASK_INIT;

  // Grid as the forward's: (kv heads, batch, key tiles) when tile_major, else (key tiles, kv heads, batch).
  const GridPos pos(tile_major);
  const int kt = pos.tile, hk = pos.head, b = pos.batch;
  const int group = Hq / Hkv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int g = lane >> 2, t4 = lane & 3;
  const int k0 = kt * KB_N, k1 = min(k0 + KB_N, Nk) - 1;
  const i64 kvbase = ((i64)b * Hkv + hk) * Nk;

  load_panels<KB_N, DQK, NT>(sKa, k + kvbase * DQK, DQK, k0, Nk, tid);
  load_panels<KB_N, DV, NT>(sVa, v + kvbase * DV, DV, k0, Nk, tid);

  float dka[DQK / 8][4], dva[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DQK / 8; ++i) dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = 0.f;
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.f;

  const int nqt = (Nq + KB_Q - 1) / KB_Q;
  const int total = group * nqt;  // (query head of the group, query tile) pairs
  const TileClasses<false> classes(m, k0, k1, Nq, Nk);
  auto tile_class = [&](int q0) { return classes(q0, min(q0 + KB_Q, Nq) - 1); };
  auto live = [&](int it) { return tile_class((it % nqt) * KB_Q) != 0; };
  auto issue = [&](int it, int bf) {
    const int h = hk * group + it / nqt, q0 = (it % nqt) * KB_Q;
    const i64 qbase = ((i64)b * Hq + h) * Nq;
    load_panels<KB_Q, DQK, NT>(sQa + bf * (KB_Q * DQK * 2), q + qbase * DQK, DQK, q0, Nq, tid);
    load_panels<KB_Q, DV, NT>(sOa + bf * (KB_Q * DV * 2), dout + qbase * DV, DV, q0, Nq, tid);
    if (tid < KB_Q) {
      const int r = q0 + tid;
      const bool in = r < Nq;
      sL[bf * KB_Q + tid] = in ? lse2_of(lse[qbase + r]) : INF;
      sD[bf * KB_Q + tid] = in ? delta[qbase + r] : 0.f;
    }
  };

  // This warp's key rows: kr0 = k0 + 16 warp + g and kr0 + 8; this warpgroup's K / V rows in each panel.
  const int kr0 = k0 + warp * 16 + g;
  const u32 k_wg = sKa + wg * (64 * 128), v_wg = sVa + wg * (64 * 128);

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
    fence_async_smem();
    __syncthreads();

    const int q0 = (it % nqt) * KB_Q;
    const int cls = tile_class(q0);
    const u32 qb = sQa + buf * (KB_Q * DQK * 2), ob = sOa + buf * (KB_Q * DV * 2);
    const float* sLb = sL + buf * KB_Q;
    const float* sDb = sD + buf * KB_Q;

    // S^T = K_wg Q^T and dP^T = V_wg dO^T: 64 keys x 64 queries each.
    float st[KB_Q / 8][4], dpt[KB_Q / 8][4];
    wg_arrive();
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk)
      wgmma_ss<KB_Q>(&st[0][0], wg_desc(k_wg + (kk >> 2) * (KB_N * 128) + (kk & 3) * 32, 16, 1024),
                     wg_desc(qb + (kk >> 2) * (KB_Q * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
#pragma unroll
    for (int kk = 0; kk < DV / 16; ++kk)
      wgmma_ss<KB_Q>(&dpt[0][0], wg_desc(v_wg + (kk >> 2) * (KB_N * 128) + (kk & 3) * 32, 16, 1024),
                     wg_desc(ob + (kk >> 2) * (KB_Q * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
    wg_commit();
    wg_wait<0>();
    wg_hold<KB_Q / 2>(&st[0][0]);
    wg_hold<KB_Q / 2>(&dpt[0][0]);

#if MODS
    const Mods<float> md(MOD_ARGS, b, hk * group + it / nqt, Hq, Nq, Nk, 1.4426950408889634f);
    bwd_p_ds<KB_Q / 8>(m, classes, cls, kr0, q0, Nq, Nk, t4, sLb, sDb, st, dpt, scale_log2, md);
#else
    bwd_p_ds<KB_Q / 8>(m, classes, cls, kr0, q0, Nq, Nk, t4, sLb, sDb, st, dpt, scale_log2);
#endif

    // dS^T rows (this warp's keys) into sS: 128-byte rows of 64 queries, chunk nt at nt ^ (row & 7);
    // keys past Nk hold 0.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kl = warp * 16 + g + 8 * r;
      const bool in = k0 + kl < Nk;
#pragma unroll
      for (int nt = 0; nt < KB_Q / 8; ++nt) {
        const u32 val = in ? pack2(dpt[nt][2 * r], dpt[nt][2 * r + 1]) : 0u;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sSa + kl * 128 + ((nt ^ (kl & 7)) << 4) + 4 * t4), "r"(val));
      }
    }

    // dV += P^T dO and dK += dS^T Q: the reduction dim is the 64 queries, rows of the dO / Q tiles
    // (MN-major B: 16 queries = 2048 bytes per step, panels KB_Q * 128 bytes apart).
    u32 ap[KB_Q / 16][4], as[KB_Q / 16][4];
#pragma unroll
    for (int kk = 0; kk < KB_Q / 16; ++kk) {
      ap[kk][0] = pack2(st[2 * kk][0], st[2 * kk][1]);
      ap[kk][1] = pack2(st[2 * kk][2], st[2 * kk][3]);
      ap[kk][2] = pack2(st[2 * kk + 1][0], st[2 * kk + 1][1]);
      ap[kk][3] = pack2(st[2 * kk + 1][2], st[2 * kk + 1][3]);
      as[kk][0] = pack2(dpt[2 * kk][0], dpt[2 * kk][1]);
      as[kk][1] = pack2(dpt[2 * kk][2], dpt[2 * kk][3]);
      as[kk][2] = pack2(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
      as[kk][3] = pack2(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
    }
    wg_arrive();
#pragma unroll
    for (int kk = 0; kk < KB_Q / 16; ++kk) wgmma_rs_t<DV>(&dva[0][0], ap[kk], wg_desc(ob + kk * 2048, KB_Q * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < KB_Q / 16; ++kk) wgmma_rs_t<DQK>(&dka[0][0], as[kk], wg_desc(qb + kk * 2048, KB_Q * 128, 1024));
    wg_commit();
#if BWD_OVERLAP == 0
    // Retire the P / dS fragments before the dQ accumulators exist (registers: ATTNHUB_CUDA_BWD_OVERLAP).
    wg_wait<0>();
    wg_hold<DQK / 2>(&dka[0][0]);
    wg_hold<DV / 2>(&dva[0][0]);
#endif

    // dQ[q0 .. q0 + 63, this warpgroup's columns] += dS K over the KB_N keys: A = dS read MN-major
    // from sS (16 keys = 2048 bytes per step), B = K MN-major (its rows are the reduction dim).
    fence_async_smem();
    __syncthreads();  // sS complete
    float dqa[DQN / 8][4];
    // Byte offset of this warpgroup's first dQ column in the K panels: whole panels, or half a panel's
    // 128-byte row (32 columns) when DQN = 32 (the swizzle is applied to the final address).
    const u32 dq_col0 = (wg * DQN / 64) * (KB_N * 128) + ((wg * DQN) % 64) * 2;
    wg_arrive();
#pragma unroll
    for (int kk = 0; kk < KB_N / 16; ++kk)
      wgmma_ss<DQN, 1, 1>(&dqa[0][0], wg_desc(sSa + kk * 2048, 64 * 128, 1024),
                          wg_desc(sKa + dq_col0 + kk * 2048, KB_N * 128, 1024), kk > 0);
    wg_commit();
    wg_wait<0>();
    wg_hold<DQN / 2>(&dqa[0][0]);
    wg_hold<DQK / 2>(&dka[0][0]);
    wg_hold<DV / 2>(&dva[0][0]);
    {
      const int h = hk * group + it / nqt;
      const int qr = q0 + (warp & 3) * 16 + g;
      const i64 qrow = ((i64)b * Hq + h) * Nq + qr;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (qr + 8 * r >= Nq) continue;
        float* dst = dqacc + (qrow + 8 * r) * DQK + wg * DQN + 2 * t4;
#pragma unroll
        for (int i = 0; i < DQN / 8; ++i) red_add2(dst + i * 8, dqa[i][2 * r], dqa[i][2 * r + 1]);
      }
    }
    __syncthreads();
    buf ^= 1;
    it = nx;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = kr0 + 8 * r;
    if (key >= Nk) continue;
    T* dkr = dk + (kvbase + key) * DQK;
    T* dvr = dv + (kvbase + key) * DV;
#pragma unroll
    for (int dt = 0; dt < DQK / 8; ++dt)
      *reinterpret_cast<u32*>(dkr + dt * 8 + 2 * t4) = pack2(dka[dt][2 * r] * scale, dka[dt][2 * r + 1] * scale);
#pragma unroll
    for (int dt = 0; dt < DV / 8; ++dt)
      *reinterpret_cast<u32*>(dvr + dt * 8 + 2 * t4) = pack2(dva[dt][2 * r], dva[dt][2 * r + 1]);
  }
}
