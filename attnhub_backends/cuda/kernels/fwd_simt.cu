// attnhub CUDA backend: SIMT forward for every dtype (float32 / float64 in their own precision,
// float16 / bfloat16 with float32 accumulation) and any head dims up to 128.
// 8 warps x 4 query rows per block; 32 keys per tile, one key per lane for the logits; lanes own
// output dims (lane + 32 c) for P V. Online softmax in registers, fully masked tiles skipped.
// Compile-time parameter: ATT_DTYPE (0 f16, 1 bf16, 2 f32, 3 f64).

#define SB_M 32   // query rows per block
#define SB_N 32   // keys per tile
#define SB_R 4    // query rows per warp
#define SB_C 4    // output chunks of 32 dims per lane (Dv <= 128)

extern "C" __global__ void __launch_bounds__(256) attn_fwd_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, OT* __restrict__ o,
    ACC* __restrict__ lse, i64 qsb, i64 qsh, i64 qsn, i64 ksb, i64 ksh, i64 ksn, i64 vsb, i64 vsh,
    i64 vsn, int Hq, int group, int Nq, int Nk, int Dqk, int Dv, double scale_d, MASK_PARAMS MOD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ldk = Dqk + 1;
  const int nch = (Dv + 31) / 32;
  const int ldv = nch * 32;
  ACC* sQ = reinterpret_cast<ACC*>(smem_raw);  // SB_M x Dqk
  ACC* sK = sQ + SB_M * Dqk;                    // SB_N x (Dqk + 1)
  ACC* sV = sK + SB_N * ldk;                    // SB_N x ldv (zero padded)
  const Mask m = MASK_INIT;
  const ACC scale = (ACC)scale_d;
  const ACC NEG = -acc_inf(scale);

  const int ntq = (Nq + SB_M - 1) / SB_M;
  const int qt = ntq - 1 - (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / group;
  const T* qp = q + b * qsb + h * qsh;
  const T* kp = k + b * ksb + hk * ksh;
  const T* vp = v + b * vsb + hk * vsh;
  const i64 bh = (i64)b * Hq + h;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int q0 = qt * SB_M, q1 = min(q0 + SB_M, Nq) - 1;
#if MODS
  const Mods<ACC> md(MOD_ARGS, b, h, Hq, Nq, Nk, (ACC)1);
#endif

  for (int e = tid; e < SB_M * Dqk; e += 256) {
    int r = e / Dqk, d = e - r * Dqk;
    sQ[e] = (q0 + r < Nq) ? (ACC)to_f(qp[(i64)(q0 + r) * qsn + d]) : (ACC)0;
  }

  int qy[SB_R], qx[SB_R];
  i64 fq[SB_R];
  ACC mrow[SB_R], lrow[SB_R], oacc[SB_R][SB_C];
#pragma unroll
  for (int i = 0; i < SB_R; ++i) {
    m.qpos(min(q0 + warp * SB_R + i, Nq - 1), qy[i], qx[i], fq[i]);
    mrow[i] = NEG;
    lrow[i] = 0;
#pragma unroll
    for (int c = 0; c < SB_C; ++c) oacc[i][c] = 0;
  }

  const int nkt = (Nk + SB_N - 1) / SB_N;
  for (int j = 0; j < nkt; ++j) {
    const int k0 = j * SB_N, k1 = min(k0 + SB_N, Nk) - 1;
    const int cls = m.tile(q0, q1, k0, k1);
    if (cls == 0) continue;
    __syncthreads();
    for (int e = tid; e < SB_N * Dqk; e += 256) {
      int r = e / Dqk, d = e - r * Dqk;
      sK[r * ldk + d] = (k0 + r < Nk) ? (ACC)to_f(kp[(i64)(k0 + r) * ksn + d]) : (ACC)0;
    }
    for (int e = tid; e < SB_N * ldv; e += 256) {
      int r = e / ldv, d = e - r * ldv;
      sV[e] = (k0 + r < Nk && d < Dv) ? (ACC)to_f(vp[(i64)(k0 + r) * vsn + d]) : (ACC)0;
    }
    __syncthreads();

    const int kn = k0 + lane;
    const bool kin = kn < Nk;
    int ky = 0, kx = 0;
    i64 fk = 0;
    if (kin) m.kpos(kn, ky, kx, fk);
    ACC p[SB_R], dot[SB_R];
#pragma unroll
    for (int i = 0; i < SB_R; ++i) dot[i] = 0;
    {
      const ACC* qr = sQ + warp * SB_R * Dqk;
      const ACC* kr = sK + lane * ldk;
      int d = 0;
#if ATT_DTYPE == 3
      // double2 broadcast reads of Q (same summation order as the scalar loop below)
      if ((Dqk & 1) == 0) {
        for (; d < Dqk; d += 2) {
          const ACC k0 = kr[d], k1 = kr[d + 1];
#pragma unroll
          for (int i = 0; i < SB_R; ++i) {
            const double2 qv = *reinterpret_cast<const double2*>(qr + i * Dqk + d);
            dot[i] += qv.x * k0;
            dot[i] += qv.y * k1;
          }
        }
      }
#else
      // float4 broadcast reads of Q: 4 K loads and SB_R Q loads per 4 SB_R FMAs
      if ((Dqk & 3) == 0) {
        for (; d < Dqk; d += 4) {
          const ACC k0 = kr[d], k1 = kr[d + 1], k2 = kr[d + 2], k3 = kr[d + 3];
#pragma unroll
          for (int i = 0; i < SB_R; ++i) {
            const float4 qv = *reinterpret_cast<const float4*>(qr + i * Dqk + d);
            dot[i] += qv.x * k0;
            dot[i] += qv.y * k1;
            dot[i] += qv.z * k2;
            dot[i] += qv.w * k3;
          }
        }
      }
#endif
#pragma unroll 4
      for (; d < Dqk; ++d) {
        const ACC kd = kr[d];
#pragma unroll
        for (int i = 0; i < SB_R; ++i) dot[i] += qr[i * Dqk + d] * kd;
      }
    }
#pragma unroll
    for (int i = 0; i < SB_R; ++i) {
      ACC sv = dot[i] * scale;
#if MODS
      if (kin) {
        ACC th;
        sv = md.apply(sv, min(q0 + warp * SB_R + i, Nq - 1), kn, th);
      }
#endif
      bool ok = kin && (cls == 2 || m.attend(qy[i], qx[i], fq[i], ky, kx, fk));
      if (!ok) sv = NEG;
      ACC mx_ = sv;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx_ = fmax(mx_, __shfl_xor_sync(0xffffffff, mx_, off));
      mx_ = fmax(mx_, mrow[i]);
      const ACC mu = (mx_ == NEG) ? (ACC)0 : mx_;
      const ACC alpha = acc_exp(mrow[i] - mu);
      mrow[i] = mx_;
      p[i] = acc_exp(sv - mu);
      lrow[i] = lrow[i] * alpha + p[i];
#pragma unroll
      for (int c = 0; c < SB_C; ++c) oacc[i][c] *= alpha;
    }
    for (int jj = 0; jj < SB_N; ++jj) {
      const ACC* vr = sV + jj * ldv + lane;
#pragma unroll
      for (int i = 0; i < SB_R; ++i) {
        const ACC pj = __shfl_sync(0xffffffff, p[i], jj);
#pragma unroll
        for (int c = 0; c < SB_C; ++c)
          if (c < nch) oacc[i][c] += pj * vr[c * 32];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < SB_R; ++i) {
    const int row = q0 + warp * SB_R + i;
    ACC l = lrow[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffff, l, off);
    if (row >= Nq) continue;
    const ACC inv = (l == (ACC)0) ? (ACC)0 : (ACC)1 / l;
    OT* orow = o + (bh * Nq + row) * Dv;
#pragma unroll
    for (int c = 0; c < SB_C; ++c) {
      int d = lane + 32 * c;
#if O_F32
      if (c < nch && d < Dv) orow[d] = (float)(oacc[i][c] * inv);
#else
      if (c < nch && d < Dv) orow[d] = store_t(oacc[i][c] * inv);
#endif
    }
    if (lane == 0) lse[bh * Nq + row] = (l == (ACC)0) ? NEG : mrow[i] + acc_log(l);
  }
}
