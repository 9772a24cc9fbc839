// attnhub CUDA backend: tensor-core forward for float16 / bfloat16 (sm_80+).
// mma.sync m16n8k16 with float32 accumulators, online softmax in registers, Q/K/V tiles loaded with
// cp.async into XOR-swizzled shared memory, K/V double-buffered, fully masked tiles skipped.
// Compile-time parameters (defined by the host): ATT_DTYPE (0 f16, 1 bf16), DQK, DV, NWARPS, BN and
// RB, the 16-row blocks per warp. With RB = 1 the Q fragments stay in registers; with RB > 1 they are
// re-read from shared memory each tile, and every K/V fragment read feeds RB mma instructions.



constexpr int BM = 16 * RB * NWARPS;
constexpr int NT = 32 * NWARPS;

extern "C" __global__ void __launch_bounds__(NT) attn_fwd_mma(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, OT* __restrict__ o,
    float* __restrict__ lse, i64 qsb, i64 qsh, i64 qsn, i64 ksb, i64 ksh, i64 ksn, i64 vsb, i64 vsh,
    i64 vsn, int Hq, int group, int Nq, int Nk, float scale_log2, int tile_major, MASK_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * DQK;
  T* sV = sK + 2 * BN * DQK;
  const Mask m = MASK_INIT;

  const int ntq = (Nq + BM - 1) / BM;
  // Blocks start in x, y, z order. tile_major (causal rules, whose work grows with the query tile):
  // grid (heads, batch, query tiles), so the heaviest tiles of every head start first and the light
  // ones fill the tail. Otherwise grid (query tiles, heads, batch): the blocks running together share
  // their head's K and V in L2.
  const GridPos pos(tile_major);
  const int qi = pos.tile, h = pos.head, b = pos.batch;
  const int qt = ntq - 1 - qi, hk = h / group;
  const T* qp = q + b * qsb + h * qsh;
  const T* kp = k + b * ksb + hk * ksh;
  const T* vp = v + b * vsb + hk * vsh;
  const i64 bh = (i64)b * Hq + h;
  OT* op = o + bh * Nq * DV;
  float* lp = lse + bh * Nq;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int q0 = qt * BM, q1 = min(q0 + BM, Nq) - 1;
  const int nkt = (Nk + BN - 1) / BN;
  const KeyTiles<BN> tiles(m, q0, q1, Nq, Nk);

  load_tile<BM, DQK, NT>(sQ, qp, qsn, q0, Nq, tid);
  int j = tiles.live(0);
  if (j < nkt) {
    load_tile<BN, DQK, NT>(sK, kp, ksn, j * BN, Nk, tid);
    load_tile<BN, DV, NT>(sV, vp, vsn, j * BN, Nk, tid);
  }
  cp_async_commit();

  // Rows of this thread: block rb of the warp, rows g and g + 8 (index 2 rb + r). Their positions
  // are recomputed in masked tiles only, which keeps registers free for the accumulators.
  float mrow[2 * RB], lrow[2 * RB];
  float oacc[RB][DV / 8][4];
  fwd_init_rows<RB, DV / 8>(mrow, lrow, oacc);
  const int arow = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix row of an A (16 x 16) fragment
  // Byte offsets of this lane's first fragment in the swizzled tiles. A fragment at chunk c0 + C
  // (C a multiple of the chunks the lane part c0 spans) is at offset ^ (C << 4): the swizzle XORs
  // the chunk with the row's low 3 bits, and row offsets are multiples of 8 rows (whole swizzle
  // periods), so every ldmatrix address is a base plus compile-time XOR / add constants.
  const u32 k_off = 2 * swz<DQK>(lane & 7, lane >> 3);                  // K: rows nt * 8 + (lane & 7)
  const u32 q_off = 2 * swz<DQK>(warp * RB * 16 + arow, lane >> 4);     // Q: rows of row block 0
  const u32 v_off = 2 * swz<DV>(arow, lane >> 4);                       // V (transposed): rows kk * 16 + arow
  const u32 sQa = smem_u32(sQ), sKa = smem_u32(sK), sVa = smem_u32(sV);
#if RB == 1
  u32 qf[DQK / 16][4];
  bool have_q = false;
#endif
  int buf = 0;

  while (j < nkt) {
    const int jn = tiles.live(j + 1);
    if (jn < nkt) {
      load_tile<BN, DQK, NT>(sK + (buf ^ 1) * BN * DQK, kp, ksn, jn * BN, Nk, tid);
      load_tile<BN, DV, NT>(sV + (buf ^ 1) * BN * DV, vp, vsn, jn * BN, Nk, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
#if RB == 1
    if (!have_q) {
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk) ldsm_x4(qf[kk], sQ + swz<DQK>(warp * 16 + arow, kk * 2 + (lane >> 4)));
      have_q = true;
    }
#endif

    // S = Q K^T for this warp's RB x 16 rows and BN keys.
    float s[RB][BN / 8][4];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) s[rb][nt][0] = s[rb][nt][1] = s[rb][nt][2] = s[rb][nt][3] = 0.f;
    const u32 kb = sKa + buf * (BN * DQK * 2);
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk += 2) {
#if RB > 1
      u32 qreg[RB][2][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        ldsm_x4_a(qreg[rb][0], sQa + rb * (16 * DQK * 2) + (q_off ^ ((kk * 2) << 4)));
        ldsm_x4_a(qreg[rb][1], sQa + rb * (16 * DQK * 2) + (q_off ^ ((kk * 2 + 2) << 4)));
      }
#endif
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        u32 bf[4];
        ldsm_x4_a(bf, kb + (k_off ^ ((kk * 2) << 4)) + nt * (8 * DQK * 2));
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
#if RB == 1
          mma16816(s[rb][nt], qf[kk], bf[0], bf[1]);
          mma16816(s[rb][nt], qf[kk + 1], bf[2], bf[3]);
#else
          mma16816(s[rb][nt], qreg[rb][0], bf[0], bf[1]);
          mma16816(s[rb][nt], qreg[rb][1], bf[2], bf[3]);
#endif
        }
      }
    }

    const int k0 = j * BN;
    const int cls = tiles.cls(j);
    const bool masked = cls != 2 || k0 + BN > Nk;
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      float alpha[2];
      fwd_softmax_step<BN / 8>(m, s[rb], q0 + (warp * RB + rb) * 16 + g, k0, Nq, Nk, t4, masked, &mrow[2 * rb],
                               &lrow[2 * rb], alpha, scale_log2);
      // Rescale the accumulators unconditionally: skipping it when no row max of the warp changed (a
      // warp vote and a branch) was slower, as the branch keeps the multiplies from interleaving
      // with the P V mma instructions.
#pragma unroll
      for (int dt = 0; dt < DV / 8; ++dt) {
        oacc[rb][dt][0] *= alpha[0];
        oacc[rb][dt][1] *= alpha[0];
        oacc[rb][dt][2] *= alpha[1];
        oacc[rb][dt][3] *= alpha[1];
      }
    }

    // O += P V; each V fragment read feeds RB mma instructions.
    const u32 vb = sVa + buf * (BN * DV * 2);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      u32 a[RB][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        a[rb][0] = pack2(s[rb][2 * kk][0], s[rb][2 * kk][1]);
        a[rb][1] = pack2(s[rb][2 * kk][2], s[rb][2 * kk][3]);
        a[rb][2] = pack2(s[rb][2 * kk + 1][0], s[rb][2 * kk + 1][1]);
        a[rb][3] = pack2(s[rb][2 * kk + 1][2], s[rb][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dt = 0; dt < DV / 8; dt += 2) {
        u32 bf[4];
        ldsm_x4_t_a(bf, vb + kk * (16 * DV * 2) + (v_off ^ (dt << 4)));
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          mma16816(oacc[rb][dt], a[rb], bf[0], bf[1]);
          mma16816(oacc[rb][dt + 1], a[rb], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();
    buf ^= 1;
    j = jn;
  }
  cp_async_wait<0>();

  // Normalise and store.
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
    fwd_store_rows<DV / 8>(oacc[rb], &lrow[2 * rb], &mrow[2 * rb], op, lp, q0 + (warp * RB + rb) * 16 + g, Nq, t4);
}
