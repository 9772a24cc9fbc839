// attnhub CUDA backend: float32 forward on float16 tensor cores with float32 accuracy (sm_80+), "3xFP16".
// A float32 operand x is scaled by a power of two per (batch, head) and split into two float16 numbers,
// x 2^e = hi + lo (hi = fp16(x 2^e), lo = fp16(x 2^e - hi)); a product a.b is then
// a_lo.b_hi + a_hi.b_lo + a_hi.b_hi with mma.sync m16n8k16 .f16 and float32 accumulation. float16 keeps
// 11 significant bits, like tf32, so the dropped a_lo.b_lo term and the rounding of lo are ~2^-21
// relative, as in 3xTF32 (fwd_tf32.cu), while one m16n8k16 instruction does twice the work of a tf32
// m16n8k8. What float16 lacks is range: the scale 2^e (split_exp) brings the largest finite |x| of each
// (batch, head) to [2^14, 2^15), so nothing overflows and lo stays normal down to 2^-17 of that
// maximum; smaller elements keep an absolute error below 2^-39 of it. The scales are undone exactly:
// 2^-(eq + ek) in the softmax scale, 2^-(ev + PSH) at the output.
//
// Three kernels: attn_absmax (the largest finite |x| of each (batch, head), atomicMax on the float's
// bits), attn_split (hi and lo as two contiguous (B, H, N, D) float16 arrays), each over q, k and v
// in one launch, and attn_fwd_f16x3 (the
// attention, structured as fwd_mma.cu: XOR-swizzled tiles filled with cp.async, K/V double-buffered,
// online softmax in registers with frag.cuh, fully masked tiles skipped). P is split in registers
// after scaling by 2^PSH (P <= 1, so its lo stays normal down to P = 2^-(3 + PSH)). P V is summed per
// key tile into a fresh accumulator that is then added to O in ordinary float32 (the tensor core's
// accumulation truncates; see fwd_tf32.cu and docs/backends/cuda.md).
// Compile-time parameters: DQK, DV (multiples of 16), NWARPS, BN (multiple of 16), RB (16-row blocks
// per warp); ATT_DTYPE is 0 (float16 operands), O_F32 1.

constexpr int BM = 16 * RB * NWARPS;
constexpr int NT = 32 * NWARPS;
constexpr int PSH = 12;

// 2^e with e in [-126, 127] (a normal float).
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((e + 127) << 23); }

// The exponent e that brings amax (the largest finite |x|, >= 0) to [2^14, 2^15); 0 for amax = 0.
// Capped at 126: an amax below 2^-111 keeps only the float16 subnormals' precision.
__device__ __forceinline__ int split_exp(float amax) {
  if (!(amax > 0.f)) return 0;
  int x;
  frexpf(amax, &x);  // amax = f 2^x, f in [0.5, 1)
  return min(15 - x, 126);
}

// hi, lo of a scaled element; an infinite one keeps lo = 0 (not inf - inf).
__device__ __forceinline__ void split_h(float xs, __half& hi, __half& lo) {
  hi = __float2half_rn(xs);
  const float r = isinf(xs) ? 0.f : xs - __half2float(hi);
  lo = __float2half_rn(r);
}

// The preparation kernels cover q, k and v in one launch each: a 1-d grid whose blocks are, per
// tensor t, (batch, head, 32-row chunk) in that order, tensor t's blocks ending at block end_t.
// SPLIT_ARGS: per tensor its base, (batch, head, row) strides, heads, rows, head dim, maximum slot
// (amax + b H + h), hi and lo arrays (contiguous (B, H, N, D) float16).
constexpr int SPLIT_ROWS = 32;
#define SPLIT_TENSOR(t)                                                                             \
  const float *x##t, i64 sb##t, i64 sh##t, i64 sn##t, int H##t, int N##t, int D##t, float *am##t, \
      __half *hi##t, __half *lo##t
#define SPLIT_ARGS SPLIT_TENSOR(0), SPLIT_TENSOR(1), SPLIT_TENSOR(2), i64 end0, i64 end1
#define SPLIT_NAME(t) x##t, sb##t, sh##t, sn##t, H##t, N##t, D##t, am##t, hi##t, lo##t
#define SPLIT_NAMES SPLIT_NAME(0), SPLIT_NAME(1), SPLIT_NAME(2), end0, end1

// One tensor's share of the work of a preparation block: which rows of which head.
struct SplitPart {
  const float* x;  // the head's first row
  i64 sn;
  int rows, D, r0;
  float* amax;  // the head's maximum slot
  __half *hi, *lo;  // the head's first row of each
  __device__ __forceinline__ SplitPart(const float* base, i64 sb, i64 sh, i64 sn_, int H, int N, int D_,
                                       float* am, __half* hi_, __half* lo_, i64 local) {
    const i64 chunks = (N + SPLIT_ROWS - 1) / SPLIT_ROWS;
    const i64 bh = local / chunks;
    const int b = (int)(bh / H), h = (int)(bh % H);
    r0 = (int)(local % chunks) * SPLIT_ROWS;
    rows = min(SPLIT_ROWS, N - r0);
    x = base + b * sb + h * sh;
    sn = sn_;
    D = D_;
    amax = am + bh;
    hi = hi_ + bh * N * D_;
    lo = lo_ + bh * N * D_;
  }
};
__device__ __forceinline__ SplitPart split_part(SPLIT_ARGS) {
  const i64 blk = blockIdx.x;
  if (blk < end0) return SplitPart(x0, sb0, sh0, sn0, H0, N0, D0, am0, hi0, lo0, blk);
  if (blk < end1) return SplitPart(x1, sb1, sh1, sn1, H1, N1, D1, am1, hi1, lo1, blk - end0);
  return SplitPart(x2, sb2, sh2, sn2, H2, N2, D2, am2, hi2, lo2, blk - end1);
}

// Largest finite |x| of the block's rows, into the head's maximum slot (atomicMax on the bits).
extern "C" __global__ void __launch_bounds__(256) attn_absmax(SPLIT_ARGS) {
  const SplitPart p = split_part(SPLIT_NAMES);
  const int ch = p.D / 4;
  float mx = 0.f;
  for (int c = threadIdx.x; c < p.rows * ch; c += 256) {
    const float4 v = *reinterpret_cast<const float4*>(p.x + (i64)(p.r0 + c / ch) * p.sn + (c % ch) * 4);
    const float e4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = fabsf(e4[i]);
      if (a <= 3.402823466e38f) mx = fmaxf(mx, a);  // finite only (NaN and inf compare false)
    }
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  __shared__ float part[8];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) mx = fmaxf(mx, part[w]);
    // non-negative floats order as their bit patterns
    atomicMax(reinterpret_cast<unsigned int*>(p.amax), __float_as_uint(mx));
  }
}

// hi and lo of the block's rows, scaled by 2^split_exp(maximum of the head).
extern "C" __global__ void __launch_bounds__(256) attn_split(SPLIT_ARGS) {
  const SplitPart p = split_part(SPLIT_NAMES);
  const float s = exp2i(split_exp(*p.amax));
  const int ch = p.D / 4;
  for (int c = threadIdx.x; c < p.rows * ch; c += 256) {
    const int r = p.r0 + c / ch, col = (c % ch) * 4;
    const float4 v = *reinterpret_cast<const float4*>(p.x + (i64)r * p.sn + col);
    __half h4[4], l4[4];
    split_h(v.x * s, h4[0], l4[0]);
    split_h(v.y * s, h4[1], l4[1]);
    split_h(v.z * s, h4[2], l4[2]);
    split_h(v.w * s, h4[3], l4[3]);
    *reinterpret_cast<uint2*>(p.hi + (i64)r * p.D + col) = *reinterpret_cast<uint2*>(h4);
    *reinterpret_cast<uint2*>(p.lo + (i64)r * p.D + col) = *reinterpret_cast<uint2*>(l4);
  }
}

// (hi, lo) float16 pairs of two accumulator values (P, already scaled; finite).
__device__ __forceinline__ void split2(float a, float b, u32& hi, u32& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const u32*>(&h);
  lo = *reinterpret_cast<const u32*>(&l);
}
// c += a.b in 3xFP16, small terms first.
__device__ __forceinline__ void mma3h(float* c, const u32* ah, const u32* al, u32 bh0, u32 bh1, u32 bl0, u32 bl1) {
  mma16816(c, al, bh0, bh1);
  mma16816(c, ah, bl0, bl1);
  mma16816(c, ah, bh0, bh1);
}

extern "C" __global__ void __launch_bounds__(NT) attn_fwd_f16x3(
    const T* __restrict__ qh, const T* __restrict__ ql, const T* __restrict__ kh, const T* __restrict__ kl,
    const T* __restrict__ vh, const T* __restrict__ vl, float* __restrict__ o, float* __restrict__ lse,
    const float* __restrict__ amax_q, const float* __restrict__ amax_k, const float* __restrict__ amax_v,
    int Hq, int group, int Nq, int Nk, float scale_log2, int tile_major, MASK_PARAMS) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Q hi, Q lo, then per buffer K hi, K lo, V hi, V lo.
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sKV = sQ + 2 * BM * DQK;
  constexpr int KV = 2 * BN * (DQK + DV);  // elements of one K/V buffer
  const Mask m = MASK_INIT;

  const int ntq = (Nq + BM - 1) / BM;
  const GridPos pos(tile_major);
  const int qi = pos.tile, h = pos.head, b = pos.batch;
  const int qt = ntq - 1 - qi, hk = h / group, Hk = Hq / group;
  const i64 bh = (i64)b * Hq + h, bhk = (i64)b * Hk + hk;
  const i64 qoff = bh * Nq * DQK, koff = bhk * Nk * DQK, voff = bhk * Nk * DV;
  float* op = o + bh * Nq * DV;
  float* lp = lse + bh * Nq;
  const int eq = split_exp(amax_q[bh]), ek = split_exp(amax_k[bhk]), ev = split_exp(amax_v[bhk]);
  const float sc = ldexpf(scale_log2, -(eq + ek));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int q0 = qt * BM, q1 = min(q0 + BM, Nq) - 1;
  const int nkt = (Nk + BN - 1) / BN;
  const KeyTiles<BN> tiles(m, q0, q1, Nq, Nk);
  auto load_kv = [&](int bufi, int jt) {
    T* s = sKV + bufi * KV;
    load_tile<BN, DQK, NT>(s, kh + koff, DQK, jt * BN, Nk, tid);
    load_tile<BN, DQK, NT>(s + BN * DQK, kl + koff, DQK, jt * BN, Nk, tid);
    load_tile<BN, DV, NT>(s + 2 * BN * DQK, vh + voff, DV, jt * BN, Nk, tid);
    load_tile<BN, DV, NT>(s + 2 * BN * DQK + BN * DV, vl + voff, DV, jt * BN, Nk, tid);
  };

  load_tile<BM, DQK, NT>(sQ, qh + qoff, DQK, q0, Nq, tid);
  load_tile<BM, DQK, NT>(sQ + BM * DQK, ql + qoff, DQK, q0, Nq, tid);
  int j = tiles.live(0);
  if (j < nkt) load_kv(0, j);
  cp_async_commit();

  float mrow[2 * RB], lrow[2 * RB];
  float oacc[RB][DV / 8][4];
  fwd_init_rows<RB, DV / 8>(mrow, lrow, oacc);
  const int arow = (lane & 7) + ((lane >> 3) & 1) * 8;
  // Lane offsets (bytes) in the swizzled tiles, as in fwd_mma.cu.
  const u32 k_off = 2 * swz<DQK>(lane & 7, lane >> 3);
  const u32 q_off = 2 * swz<DQK>(warp * RB * 16 + arow, lane >> 4);
  const u32 v_off = 2 * swz<DV>(arow, lane >> 4);
  const u32 sQa = smem_u32(sQ), sKVa = smem_u32(sKV);
  constexpr u32 QLO = BM * DQK * 2, KLO = BN * DQK * 2, VHI = 2 * BN * DQK * 2, VLO = VHI + BN * DV * 2;
  int buf = 0;

  while (j < nkt) {
    const int jn = tiles.live(j + 1);
    if (jn < nkt) load_kv(buf ^ 1, jn);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    // S = Q K^T (scaled by 2^(eq + ek)).
    float s[RB][BN / 8][4];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) s[rb][nt][0] = s[rb][nt][1] = s[rb][nt][2] = s[rb][nt][3] = 0.f;
    const u32 kb = sKVa + buf * (KV * 2);
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk += 2) {
      u32 qhf[RB][2][4], qlf[RB][2][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const u32 a = sQa + rb * (16 * DQK * 2) + (q_off ^ ((kk * 2 + 2 * hf) << 4));
          ldsm_x4_a(qhf[rb][hf], a);
          ldsm_x4_a(qlf[rb][hf], a + QLO);
        }
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        u32 bh_[4], bl_[4];
        const u32 a = kb + (k_off ^ ((kk * 2) << 4)) + nt * (8 * DQK * 2);
        ldsm_x4_a(bh_, a);
        ldsm_x4_a(bl_, a + KLO);
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          mma3h(s[rb][nt], qhf[rb][0], qlf[rb][0], bh_[0], bh_[1], bl_[0], bl_[1]);
          mma3h(s[rb][nt], qhf[rb][1], qlf[rb][1], bh_[2], bh_[3], bl_[2], bl_[3]);
        }
      }
    }

    const int k0 = j * BN;
    const int cls = tiles.cls(j);
    const bool masked = cls != 2 || k0 + BN > Nk;
    float alpha[RB][2];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
      fwd_softmax_step<BN / 8>(m, s[rb], q0 + (warp * RB + rb) * 16 + g, k0, Nq, Nk, t4, masked, &mrow[2 * rb],
                               &lrow[2 * rb], alpha[rb], sc);

    // P (scaled by 2^PSH) as hi / lo A fragments, key block kk = keys 16 kk .. 16 kk + 15.
    u32 ph[RB][BN / 16][4], pl[RB][BN / 16][4];
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float* src = s[rb][2 * kk + (i >> 1)];
          const float f = (float)(1 << PSH);
          split2(src[2 * (i & 1)] * f, src[2 * (i & 1) + 1] * f, ph[rb][kk][i], pl[rb][kk][i]);
        }

    // O = alpha O + P V, the tile's P V summed in a fresh accumulator first.
    const u32 vb = sKVa + buf * (KV * 2);
#pragma unroll
    for (int dt = 0; dt < DV / 8; dt += 2) {
      float t[RB][2][4];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int e = 0; e < 4; ++e) t[rb][0][e] = t[rb][1][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        u32 bh_[4], bl_[4];
        const u32 a = vb + kk * (16 * DV * 2) + (v_off ^ (dt << 4));
        ldsm_x4_t_a(bh_, a + VHI);
        ldsm_x4_t_a(bl_, a + VLO);
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          mma3h(t[rb][0], ph[rb][kk], pl[rb][kk], bh_[0], bh_[1], bl_[0], bl_[1]);
          mma3h(t[rb][1], ph[rb][kk], pl[rb][kk], bh_[2], bh_[3], bl_[2], bl_[3]);
        }
      }
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int e = 0; e < 4; ++e) oacc[rb][dt + x][e] = fmaf(oacc[rb][dt + x][e], alpha[rb][e >> 1], t[rb][x][e]);
    }
    __syncthreads();
    buf ^= 1;
    j = jn;
  }
  cp_async_wait<0>();

  // Normalise (undoing 2^(ev + PSH)) and store.
  const float post = ldexpf(1.f, -(ev + PSH));
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
    fwd_store_rows<DV / 8>(oacc[rb], &lrow[2 * rb], &mrow[2 * rb], op, lp, q0 + (warp * RB + rb) * 16 + g, Nq, t4,
                           post);
}
