// attnhub CUDA backend: tensor-core forward for float16 / bfloat16 on Hopper (sm_90a), with wgmma.
// Each warpgroup (4 warps) owns 64 query rows: S = Q K^T is one chain of m64nBNk16 wgmma with both
// operands in shared memory, P stays in registers (the S accumulators, rounded and packed) and
// O += P V is a chain of m64nDVk16 wgmma with A from registers. Masking, the online softmax and the
// epilogue are those of fwd_mma.cu (a warp's accumulator fragments have the mma.sync layout). Q, K, V
// tiles arrive by cp.async into 128-byte-swizzled panels (wgmma.cuh), K/V double-buffered.
// Compile-time parameters (defined by the host): ATT_DTYPE (0 f16, 1 bf16), DQK, DV (64 or 128),
// NWG (warpgroups per block), BN (keys per tile: 64 or 128).

#ifndef PIPE
#define PIPE 0  // 1: S of tile j overlaps P V of tile j - 1 (three K / V buffers), see the loop
#endif
constexpr int BM = 64 * NWG;
constexpr int NT = 128 * NWG;
constexpr int NST = PIPE ? 3 : 2;  // K / V buffers
static_assert(DQK % 64 == 0 && DV % 64 == 0 && BN % 64 == 0, "wgmma forward: dims and BN multiples of 64");

extern "C" __global__ void __launch_bounds__(NT) attn_fwd_wgmma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, OT* __restrict__ o,
    float* __restrict__ lse, i64 qsb, i64 qsh, i64 qsn, i64 ksb, i64 ksh, i64 ksn, i64 vsb, i64 vsh,
    i64 vsn, int Hq, int group, int Nq, int Nk, float scale_log2, int tile_major, MASK_PARAMS MOD_PARAMS) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Panels need 1024-byte alignment (the host allocates 1 KB of slack).
  const u32 sQa = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sKa = sQa + BM * DQK * 2;
  const u32 sVa = sKa + NST * BN * DQK * 2;
  const Mask m = MASK_INIT;

  const int ntq = (Nq + BM - 1) / BM;
  // Grid order as in fwd_mma.cu: tile_major puts the heaviest causal tiles of every head first.
  const GridPos pos(tile_major);
  const int qi = pos.tile, h = pos.head, b = pos.batch;
  const int qt = ntq - 1 - qi, hk = h / group;
  const T* qp = q + b * qsb + h * qsh;
  const T* kp = k + b * ksb + hk * ksh;
  const T* vp = v + b * vsb + hk * vsh;
  const i64 bh = (i64)b * Hq + h;
  OT* op = o + bh * Nq * DV;
  float* lp = lse + bh * Nq;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int g = lane >> 2, t4 = lane & 3;
  const int q0 = qt * BM, q1 = min(q0 + BM, Nq) - 1;
  const int nkt = (Nk + BN - 1) / BN;
  const KeyTiles<BN> tiles(m, q0, q1, Nq, Nk);
#if MODS
  const Mods<float> md(MOD_ARGS, b, h, Hq, Nq, Nk, 1.4426950408889634f);
#endif

  load_panels<BM, DQK, NT>(sQa, qp, qsn, q0, Nq, tid);
  int j = tiles.live(0);
  if (j < nkt) {
    load_panels<BN, DQK, NT>(sKa, kp, ksn, j * BN, Nk, tid);
    load_panels<BN, DV, NT>(sVa, vp, vsn, j * BN, Nk, tid);
  }
  cp_async_commit();

  // Rows of this thread: q0 + 16 warp + g (r = 0) and + 8 (r = 1).
  float mrow[2] = {ATT_NEG_INF, ATT_NEG_INF}, lrow[2] = {0.f, 0.f};
  float oacc[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  // This warpgroup's 64 Q rows in each panel.
  const u32 q_wg = sQa + wg * (64 * 128);
  auto load_kv = [&](int jt, int b) {
    load_panels<BN, DQK, NT>(sKa + b * (BN * DQK * 2), kp, ksn, jt * BN, Nk, tid);
    load_panels<BN, DV, NT>(sVa + b * (BN * DV * 2), vp, vsn, jt * BN, Nk, tid);
  };
  // S = Q K^T: DQK / 16 wgmma, 32 bytes along the row per step, the next panel every 4 steps.
  auto issue_s = [&](float* sacc, int b) {
    const u32 kb = sKa + b * (BN * DQK * 2);
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      const u64 da = wg_desc(q_wg + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024);
      const u64 db = wg_desc(kb + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
      wgmma_ss<BN>(sacc, da, db, kk > 0);
    }
  };
  // O += P V: P packed into the A fragments of BN / 16 wgmma; V rows (keys) are the reduction dim,
  // 16 keys = 2048 bytes per step, panels of 64 value columns BN * 128 bytes apart.
  auto issue_pv = [&](const u32 (*pa)[4], int b) {
    const u32 vb = sVa + b * (BN * DV * 2);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_t<DV>(&oacc[0][0], pa[kk], wg_desc(vb + kk * 2048, BN * 128, 1024));
  };
  auto pack_p = [&](u32 (*pa)[4], const float (*sp)[4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack2(sp[2 * kk][0], sp[2 * kk][1]);
      pa[kk][1] = pack2(sp[2 * kk][2], sp[2 * kk][3]);
      pa[kk][2] = pack2(sp[2 * kk + 1][0], sp[2 * kk + 1][1]);
      pa[kk][3] = pack2(sp[2 * kk + 1][2], sp[2 * kk + 1][3]);
    }
  };
  auto softmax = [&](float (*sp)[4], int jt, float* alpha) {
    const int k0 = jt * BN;
    const bool masked = tiles.cls(jt) != 2 || k0 + BN > Nk;
#if MODS
    static_assert(!SCALE_POS, "modified logits are scaled before the row max");
    fwd_mods<BN / 8>(md, sp, q0 + warp * 16 + g, k0, Nq, Nk, t4, scale_log2);
    fwd_softmax_step<BN / 8>(m, sp, q0 + warp * 16 + g, k0, Nq, Nk, t4, masked, mrow, lrow, alpha, 1.f);
#else
    fwd_softmax_step<BN / 8>(m, sp, q0 + warp * 16 + g, k0, Nq, Nk, t4, masked, mrow, lrow, alpha, scale_log2);
#endif
  };
  auto rescale = [&](const float* alpha) {
#pragma unroll
    for (int dt = 0; dt < DV / 8; ++dt) {
      oacc[dt][0] *= alpha[0];
      oacc[dt][1] *= alpha[0];
      oacc[dt][2] *= alpha[1];
      oacc[dt][3] *= alpha[1];
    }
  };

#if PIPE
  // Three K / V buffers: tile j (its S is computed), tile jp (its P V is in flight), and the next
  // live tile (loading). Each step issues S(j) and P(jp) V(jp) back to back, then runs the softmax of
  // S(j) while the tensor cores work on P V: the exponentials overlap the second product.
  if (j < nkt) {
    int jn = tiles.live(j + 1);
    if (jn < nkt) load_kv(jn, 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();
    float s[BN / 8][4], alpha[2];
    wg_arrive();
    issue_s(&s[0][0], 0);
    wg_commit();
    wg_wait<0>();
    wg_hold<BN / 2>(&s[0][0]);
    softmax(s, j, alpha);  // O is 0: nothing to rescale
    u32 pa[BN / 16][4];
    pack_p(pa, s);
    int bp = 0, bj = 1;  // buffers of the tile whose P V is pending and of tile j
    j = jn;
    while (j < nkt) {
      jn = tiles.live(j + 1);
      const int bf = 3 - bp - bj;  // the free buffer: its tile's P V finished before this barrier
      cp_async_wait<0>();
      fence_async_smem();
      __syncthreads();
      if (jn < nkt) load_kv(jn, bf);
      cp_async_commit();
      wg_arrive();
      issue_s(&s[0][0], bj);
      wg_commit();
      issue_pv(pa, bp);
      wg_commit();
      wg_wait<1>();
      wg_hold<BN / 2>(&s[0][0]);
      softmax(s, j, alpha);
      u32 pn[BN / 16][4];
      pack_p(pn, s);
      wg_wait<0>();
      wg_hold<DV / 2>(&oacc[0][0]);
      rescale(alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[kk][e] = pn[kk][e];
      bp = bj;
      j = jn;
      bj = bf;
    }
    wg_arrive();
    issue_pv(pa, bp);
    wg_commit();
    wg_wait<0>();
    wg_hold<DV / 2>(&oacc[0][0]);
  }
#else
  int buf = 0;
  while (j < nkt) {
    const int jn = tiles.live(j + 1);
    if (jn < nkt) load_kv(jn, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_async_smem();
    __syncthreads();

    float s[BN / 8][4], alpha[2];
    wg_arrive();
    issue_s(&s[0][0], buf);
    wg_commit();
    wg_wait<0>();
    wg_hold<BN / 2>(&s[0][0]);
    softmax(s, j, alpha);
    rescale(alpha);
    u32 pa[BN / 16][4];
    pack_p(pa, s);
    wg_arrive();
    issue_pv(pa, buf);
    wg_commit();
    wg_wait<0>();
    wg_hold<DV / 2>(&oacc[0][0]);
    __syncthreads();
    buf ^= 1;
    j = jn;
  }
#endif
  cp_async_wait<0>();

  // Normalise and store.
  fwd_store_rows<DV / 8>(oacc, lrow, mrow, op, lp, q0 + warp * 16 + g, Nq, t4);
}
