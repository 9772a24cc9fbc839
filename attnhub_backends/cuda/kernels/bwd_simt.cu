// attnhub CUDA backend: SIMT backward for every dtype (float32 accumulation for the half types).
// attn_bwd_pre: delta = rowsum(dO * O) (grid: rows / 8 blocks for half types, rows / 256 otherwise).
// attn_bwd_simt: one block per (32-key tile, kv head, batch); it walks every query head of its GQA
// group and every query tile that is not fully masked, recomputes P from lse, accumulates dK and dV
// in registers (so GQA sums need no atomics) and adds dQ into an ACC buffer with atomics.
// Compile-time parameter: ATT_DTYPE (0 f16, 1 bf16, 2 f32, 3 f64).

#define BB 32      // keys per block and query rows per step
#define BCH 16     // dims per thread in dK/dV (8 * BCH >= 128)

extern "C" __global__ void __launch_bounds__(256) attn_bwd_pre(const OT* __restrict__ o,
                                                              const T* __restrict__ dout,
                                                              ACC* __restrict__ delta, i64 rows,
                                                              int Dv) {
#if ATT_DTYPE >= 2
  // float32 / float64: one thread per row, summed in the same order as dP in attn_bwd_simt, so that
  // dS = P (dP - delta) is exactly 0 where a row attends a single key (O = V there).
  const i64 row = (i64)blockIdx.x * 256 + threadIdx.x;
  if (row >= rows) return;
  ACC acc = 0;
  for (int d = 0; d < Dv; ++d) acc += (ACC)to_f(dout[row * Dv + d]) * (ACC)to_f(o[row * Dv + d]);
  delta[row] = acc;
#else
  const i64 row = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  ACC acc = 0;
  for (int d = lane; d < Dv; d += 32) acc += (ACC)to_f(o[row * Dv + d]) * (ACC)to_f(dout[row * Dv + d]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (lane == 0) delta[row] = acc;
#endif
}

extern "C" __global__ void __launch_bounds__(256) attn_bwd_simt(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ dout, const ACC* __restrict__ lse, const ACC* __restrict__ delta,
    ACC* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv, int Hq, int Hkv, int Nq, int Nk,
    int Dqk, int Dv, double scale_d, MASK_PARAMS MOD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ldq = Dqk + 1, ldv = Dv + 1;
  ACC* sK = reinterpret_cast<ACC*>(smem_raw);  // BB x ldq
  ACC* sV = sK + BB * ldq;                      // BB x ldv
  ACC* sQ = sV + BB * ldv;                      // BB x ldq
  ACC* sO = sQ + BB * ldq;                      // BB x ldv (dO)
  ACC* sP = sO + BB * ldv;                      // BB x (BB + 1)
  ACC* sS = sP + BB * (BB + 1);                 // BB x (BB + 1) (dS)
  ACC* sL = sS + BB * (BB + 1);                 // BB lse
  ACC* sD = sL + BB;                            // BB delta
  const Mask m = MASK_INIT;
  const ACC scale = (ACC)scale_d;
  const ACC INF = acc_inf(scale);

  const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = Hq / Hkv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int k0 = kt * BB, k1 = min(k0 + BB, Nk) - 1;
  const i64 kvbase = ((i64)b * Hkv + hk) * Nk;

  for (int e = tid; e < BB * Dqk; e += 256) {
    int r = e / Dqk, d = e - r * Dqk;
    sK[r * ldq + d] = (k0 + r < Nk) ? (ACC)to_f(k[(kvbase + k0 + r) * Dqk + d]) : (ACC)0;
  }
  for (int e = tid; e < BB * Dv; e += 256) {
    int r = e / Dv, d = e - r * Dv;
    sV[r * ldv + d] = (k0 + r < Nk) ? (ACC)to_f(v[(kvbase + k0 + r) * Dv + d]) : (ACC)0;
  }

  // Logit pairs of this thread: key `lane`, query rows warp + 8 u.
  const int kn = k0 + lane;
  const bool kin = kn < Nk;
  int ky = 0, kx = 0;
  i64 fk = 0;
  if (kin) m.kpos(kn, ky, kx, fk);

  // dK / dV of key `lane`, dims warp + 8 c.
  ACC dka[BCH], dva[BCH];
#pragma unroll
  for (int c = 0; c < BCH; ++c) dka[c] = dva[c] = 0;

  const int nqt = (Nq + BB - 1) / BB;
  for (int gi = 0; gi < group; ++gi) {
    const int h = hk * group + gi;
    const i64 qbase = ((i64)b * Hq + h) * Nq;
#if MODS
    const Mods<ACC> md(MOD_ARGS, b, h, Hq, Nq, Nk, (ACC)1);
#endif
    for (int t = 0; t < nqt; ++t) {
      const int q0 = t * BB, q1 = min(q0 + BB, Nq) - 1;
      const int cls = m.tile(q0, q1, k0, k1);
      if (cls == 0) continue;
      __syncthreads();
      for (int e = tid; e < BB * Dqk; e += 256) {
        int r = e / Dqk, d = e - r * Dqk;
        sQ[r * ldq + d] = (q0 + r < Nq) ? (ACC)to_f(q[(qbase + q0 + r) * Dqk + d]) : (ACC)0;
      }
      for (int e = tid; e < BB * Dv; e += 256) {
        int r = e / Dv, d = e - r * Dv;
        sO[r * ldv + d] = (q0 + r < Nq) ? (ACC)to_f(dout[(qbase + q0 + r) * Dv + d]) : (ACC)0;
      }
      if (tid < BB) {
        bool in = q0 + tid < Nq;
        sL[tid] = in ? lse[qbase + q0 + tid] : INF;
        sD[tid] = in ? delta[qbase + q0 + tid] : (ACC)0;
      }
      __syncthreads();

#pragma unroll 1
      for (int u = 0; u < BB / 8; ++u) {
        const int i = warp + 8 * u;
        const int qn = q0 + i;
        ACC p = 0, ds = 0;
        if (qn < Nq && kin) {
          bool ok = cls == 2;
          if (!ok) {
            int qy, qx;
            i64 fq;
            m.qpos(qn, qy, qx, fq);
            ok = m.attend(qy, qx, fq, ky, kx, fk);
          }
          const ACC l = sL[i];
          if (ok && l != -INF) {
            const ACC* qr = sQ + i * ldq;
            const ACC* kr = sK + lane * ldq;
            ACC s = 0;
            for (int d = 0; d < Dqk; ++d) s += qr[d] * kr[d];
#if MODS
            ACC th;
            p = acc_exp(md.apply(s * scale, qn, kn, th) - l);
#else
            p = acc_exp(s * scale - l);
#endif
            const ACC* orow = sO + i * ldv;
            const ACC* vr = sV + lane * ldv;
            ACC dp = 0;
            for (int d = 0; d < Dv; ++d) dp += orow[d] * vr[d];
            ds = p * (dp - sD[i]);
#if MODS
            ds = md.grad(ds, th, qn, kn);
#endif
          }
        }
        sP[i * (BB + 1) + lane] = p;
        sS[i * (BB + 1) + lane] = ds;
      }
      __syncthreads();

      // dV[key][d] += sum_i P[i][key] dO[i][d];  dK[key][d] += sum_i dS[i][key] Q[i][d]
      for (int i = 0; i < BB; ++i) {
        const ACC p = sP[i * (BB + 1) + lane];
        const ACC ds = sS[i * (BB + 1) + lane];
#pragma unroll
        for (int c = 0; c < BCH; ++c) {
          const int d = warp + 8 * c;
          if (d < Dv) dva[c] += p * sO[i * ldv + d];
          if (d < Dqk) dka[c] += ds * sQ[i * ldq + d];
        }
      }
      // dQ[i][d] += scale * sum_j dS[i][j] K[j][d]
      for (int e = tid; e < BB * Dqk; e += 256) {
        const int i = e / Dqk, d = e - i * Dqk;
        if (q0 + i >= Nq) continue;
        ACC acc = 0;
#pragma unroll 8
        for (int jj = 0; jj < BB; ++jj) acc += sS[i * (BB + 1) + jj] * sK[jj * ldq + d];
        if (acc != (ACC)0) atomicAdd(dq + (qbase + q0 + i) * Dqk + d, acc * scale);
      }
    }
  }

  if (kin) {
#pragma unroll
    for (int c = 0; c < BCH; ++c) {
      const int d = warp + 8 * c;
      if (d < Dqk) dk[(kvbase + kn) * Dqk + d] = store_t(dka[c] * scale);
      if (d < Dv) dv[(kvbase + kn) * Dv + d] = store_t(dva[c]);
    }
  }
}
