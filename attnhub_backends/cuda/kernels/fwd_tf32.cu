// attnhub CUDA backend: float32 forward on tensor cores with float32 accuracy (sm_80+), "3xTF32".
// Every float32 operand x is split into x = hi + lo, hi = tf32(x) (cvt.rna), lo = x - hi (exact in
// float32; the tensor core reads its top 19 bits). Each product a.b is computed as
// a_lo.b_hi + a_hi.b_lo + a_hi.b_hi with mma.sync m16n8k8 .tf32 and float32 accumulation; the dropped
// a_lo.b_lo term and the truncation of lo are ~2^-21 relative, about the float32 rounding of a sum
// of a few products. Used for both S = Q K^T and O = P V, so no tf32 declaration is needed.
// Structure as fwd_mma.cu: each warp owns RB blocks of 16 query rows, K/V tiles double-buffered
// with cp.async, online softmax in registers (log2 domain, frag.cuh's step), fully masked tiles skipped.
// Shared-memory rows are padded by 16 bytes (Q and K are read with ldmatrix, V with 32-bit loads
// at rows 2 t4 and 2 t4 + 1: a pitch of 4 mod 32 words keeps both conflict-free).
// Compile-time parameters: DQK, DV (multiples of 16), NWARPS, BN (multiple of 8 PVC), RB.

#ifndef KS_UNROLL
#define KS_UNROLL 1
#endif
#ifndef PVC
#define PVC (RB == 1 ? 4 : 2)  // 8-key blocks per P V chunk (see the P V loop)
#endif
static_assert((BN / 8) % PVC == 0, "BN must be a multiple of 8 PVC");
constexpr int BM = 16 * RB * NWARPS;
constexpr int NT = 32 * NWARPS;
constexpr int LQ = DQK + 4;
constexpr int LK = DQK + 4;
constexpr int LV = DV + 4;

__device__ __forceinline__ void split_tf32(float x, u32& hi, u32& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
  hi &= 0xffffe000u;  // PTX leaves the container's low 13 bits unspecified: make hi an exact float
  lo = __float_as_uint(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma1688(float* c, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a.b in 3xTF32 (small terms first).
__device__ __forceinline__ void mma3(float* c, const u32* ah, const u32* al, u32 bh0, u32 bh1, u32 bl0,
                                     u32 bl1) {
  mma1688(c, al, bh0, bh1);
  mma1688(c, ah, bl0, bl1);
  mma1688(c, ah, bh0, bh1);
}
__device__ __forceinline__ void ldsm_x4_f32(u32* r, const float* p) {
  u32 s = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Copy rows [row0, row0 + R) of a (N, D) float matrix with row stride `ld` into a tile of pitch L;
// rows past N are zero-filled.
template <int R, int D, int L>
__device__ __forceinline__ void load_tile_f32(float* s, const float* g, i64 ld, int row0, int n, int tid) {
  constexpr int CH = D / 4;
#pragma unroll
  for (int c = tid; c < R * CH; c += NT) {
    int r = c / CH, ch = c % CH;
    int gr = row0 + r;
    bool ok = gr < n;
    const float* src = ok ? g + (i64)gr * ld + ch * 4 : g;
    cp_async16(s + r * L + ch * 4, src, ok);
  }
}

extern "C" __global__ void __launch_bounds__(NT) attn_fwd_tf32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    float* __restrict__ o, float* __restrict__ lse, i64 qsb, i64 qsh, i64 qsn, i64 ksb, i64 ksh, i64 ksn,
    i64 vsb, i64 vsh, i64 vsn, int Hq, int group, int Nq, int Nk, float scale_log2, MASK_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);
  float* sK = sQ + BM * LQ;
  float* sV = sK + 2 * BN * LK;
  const Mask m = MASK_INIT;

  const int ntq = (Nq + BM - 1) / BM;
  const int qt = ntq - 1 - (int)blockIdx.x;  // heaviest (latest) query tiles first under causal rules
  const int h = blockIdx.y, b = blockIdx.z, hk = h / group;
  const float* qp = q + b * qsb + h * qsh;
  const float* kp = k + b * ksb + hk * ksh;
  const float* vp = v + b * vsb + hk * vsh;
  const i64 bh = (i64)b * Hq + h;
  float* op = o + bh * Nq * DV;
  float* lp = lse + bh * Nq;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int q0 = qt * BM, q1 = min(q0 + BM, Nq) - 1;
  const int nkt = (Nk + BN - 1) / BN;
  const KeyTiles<BN> tiles(m, q0, q1, Nq, Nk);

  load_tile_f32<BM, DQK, LQ>(sQ, qp, qsn, q0, Nq, tid);
  int j = tiles.live(0);
  if (j < nkt) {
    load_tile_f32<BN, DQK, LK>(sK, kp, ksn, j * BN, Nk, tid);
    load_tile_f32<BN, DV, LV>(sV, vp, vsn, j * BN, Nk, tid);
  }
  cp_async_commit();

  float mrow[2 * RB], lrow[2 * RB], arow_[2 * RB];
  float oacc[RB][DV / 8][4];
  fwd_init_rows<RB, DV / 8>(mrow, lrow, oacc);
  const int arow = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix row of an A (16 x 8) fragment
  int buf = 0;

  while (j < nkt) {
    const int jn = tiles.live(j + 1);
    if (jn < nkt) {
      load_tile_f32<BN, DQK, LK>(sK + (buf ^ 1) * BN * LK, kp, ksn, jn * BN, Nk, tid);
      load_tile_f32<BN, DV, LV>(sV + (buf ^ 1) * BN * LV, vp, vsn, jn * BN, Nk, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    // S = Q K^T: two k-steps of 8 per ldmatrix.x4 of K; Q fragments re-read and split per tile.
    float s[RB][BN / 8][4];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) s[rb][nt][0] = s[rb][nt][1] = s[rb][nt][2] = s[rb][nt][3] = 0.f;
    const float* sKb = sK + buf * BN * LK;
#pragma unroll KS_UNROLL
    for (int ks = 0; ks < DQK / 8; ks += 2) {
      u32 qh[RB][2][4], ql[RB][2][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          u32 a[4];
          ldsm_x4_f32(a, sQ + ((warp * RB + rb) * 16 + arow) * LQ + (ks + hf) * 8 + (lane >> 4) * 4);
#pragma unroll
          for (int e = 0; e < 4; ++e) split_tf32(__uint_as_float(a[e]), qh[rb][hf][e], ql[rb][hf][e]);
        }
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        u32 kf[4], kh[4], kl[4];
        ldsm_x4_f32(kf, sKb + (nt * 8 + (lane & 7)) * LK + ks * 8 + (lane >> 3) * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) split_tf32(__uint_as_float(kf[e]), kh[e], kl[e]);
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          mma3(s[rb][nt], qh[rb][0], ql[rb][0], kh[0], kh[1], kl[0], kl[1]);
          mma3(s[rb][nt], qh[rb][1], ql[rb][1], kh[2], kh[3], kl[2], kl[3]);
        }
      }
    }

    const int k0 = j * BN;
    const bool masked = tiles.cls(j) != 2 || k0 + BN > Nk;
    // Scale, mask and online softmax (frag.cuh); arow_ is applied to O with the first P V chunk.
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
      fwd_softmax_step<BN / 8>(m, s[rb], q0 + (warp * RB + rb) * 16 + g, k0, Nq, Nk, t4, masked, &mrow[2 * rb],
                               &lrow[2 * rb], &arow_[2 * rb], scale_log2);

    // O += P V. The accumulator holds keys 2 t4, 2 t4 + 1 of each 8-key block, the A operand wants
    // k = t4, t4 + 4: k-index t4 stands for key 2 t4 and t4 + 4 for key 2 t4 + 1, and V's rows are
    // read in the same order (b0 = V[2 t4][g], b1 = V[2 t4 + 1][g]).
    // Accuracy: the tensor core's float32 accumulation truncates, and its error grows with the
    // magnitude of the running sum, so P V is summed per chunk of PVC 8-key blocks into a fresh
    // accumulator (3 PVC mma deep) that is then added to O with ordinary, rounded float32 adds.
    // Accumulating a whole row (4096 keys) in the tensor core cost ~3e-5 relative error on flat
    // softmax rows; see docs/backends/cuda.md.
    const float* sVb = sV + buf * BN * LV;
#pragma unroll
    for (int c0 = 0; c0 < BN / 8; c0 += PVC) {
      u32 ph[RB][PVC][4], pl[RB][PVC][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int i = 0; i < PVC; ++i) {
          split_tf32(s[rb][c0 + i][0], ph[rb][i][0], pl[rb][i][0]);
          split_tf32(s[rb][c0 + i][2], ph[rb][i][1], pl[rb][i][1]);
          split_tf32(s[rb][c0 + i][1], ph[rb][i][2], pl[rb][i][2]);
          split_tf32(s[rb][c0 + i][3], ph[rb][i][3], pl[rb][i][3]);
        }
#pragma unroll
      for (int dt = 0; dt < DV / 8; ++dt) {
        float t[RB][4];
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) t[rb][0] = t[rb][1] = t[rb][2] = t[rb][3] = 0.f;
#pragma unroll
        for (int i = 0; i < PVC; ++i) {
          const float* vr = sVb + ((c0 + i) * 8 + 2 * t4) * LV + dt * 8 + g;
          u32 vh0, vl0, vh1, vl1;
          split_tf32(vr[0], vh0, vl0);
          split_tf32(vr[LV], vh1, vl1);
#pragma unroll
          for (int rb = 0; rb < RB; ++rb) mma3(t[rb], ph[rb][i], pl[rb][i], vh0, vh1, vl0, vl1);
        }
#pragma unroll
        for (int rb = 0; rb < RB; ++rb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& acc = oacc[rb][dt][e];
            acc = (c0 == 0 ? acc * arow_[2 * rb + (e >> 1)] : acc) + t[rb][e];
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
