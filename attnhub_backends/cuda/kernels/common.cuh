// attnhub CUDA backend: shared helpers (mask rules from positions, tile classification, cp.async).
// Prepended to every kernel source by the compiler module; NVRTC sees one translation unit.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef long long i64;

#define ATT_NEG_INF __int_as_float(0xff800000)

// Sequence positions (SPEC §2) and rules (SPEC §3). Every request is treated as 2-d: a 1-d request
// has Y lengths of 1. A flattened index n maps to (iy, ix) = (n / lx, n % lx); its position along a
// dimension is i * a + b, where (a, b) encode the sync mode. Flat index F = Py * mx + Px.
struct Mask {
  int lqx, lkx;            // x lengths of queries and keys
  int aqy, bqy, aqx, bqx;  // query position = i * a + b per dimension
  int aky, bky, akx, bkx;  // key position = j * a + b per dimension
  int mx;                  // common-grid extent along x (row length of the flat index)
  int rule;                // 0 full, 1 causal, 2 local
  int wy, wx;              // local half-window per dimension
  int log2s;               // local stride exponent
  int lcausal;             // local rule also causal

  __device__ __forceinline__ void qpos(int n, int& py, int& px, i64& f) const {
    int iy = n < lqx ? 0 : n / lqx;  // no division in 1-d (one row)
    int ix = n - iy * lqx;
    py = iy * aqy + bqy;
    px = ix * aqx + bqx;
    f = (i64)py * mx + px;
  }
  __device__ __forceinline__ void kpos(int n, int& py, int& px, i64& f) const {
    int iy = n < lkx ? 0 : n / lkx;
    int ix = n - iy * lkx;
    py = iy * aky + bky;
    px = ix * akx + bkx;
    f = (i64)py * mx + px;
  }
  __device__ __forceinline__ i64 qflat(int n) const { int a, b; i64 f; qpos(n, a, b, f); return f; }
  __device__ __forceinline__ i64 kflat(int n) const { int a, b; i64 f; kpos(n, a, b, f); return f; }

  __device__ __forceinline__ bool attend(int qy, int qx, i64 fq, int ky, int kx, i64 fk) const {
    if (rule == 0) return true;
    if (rule == 1) return fq >= fk;
    int dy = qy > ky ? qy - ky : ky - qy;
    int dx = qx > kx ? qx - kx : kx - qx;
    int sm = (1 << log2s) - 1;
    bool ok = ((dy & sm) == 0) && ((dy >> log2s) < wy) && ((dx & sm) == 0) && ((dx >> log2s) < wx);
    if (lcausal) ok = ok && (fq >= fk);
    return ok;
  }

  // True when every query row attends one contiguous interval of key indices: 1-d requests (one
  // row along y, whose y positions are then 0) under Full, Causal or an unstrided Local rule. Keys
  // are then masked with two compares per element (key_interval) instead of evaluating the rule per
  // pair. Positions stay below 2 mx, so 32-bit arithmetic is exact for mx < 2^29.
  __device__ __forceinline__ bool one_interval(int nq, int nk) const {
    return lqx == nq && lkx == nk && bqy == 0 && bky == 0 && mx < (1 << 29) && (rule != 2 || log2s == 0);
  }
  // floor(a / b) for b >= 1 (b is 1 unless a sync mode scales positions).
  __device__ __forceinline__ static int floordiv(int a, int b) {
    if (b == 1) return a;
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  }
  // [lo, hi] (inclusive, clipped to [0, nk - 1], empty when hi < lo): the keys query row n attends,
  // for a request with one_interval(). Key positions grow with the index (akx >= 1).
  __device__ __forceinline__ void key_interval(int n, int nk, int& lo, int& hi) const {
    const int qx = n * aqx + bqx;
    int l = 0, h = nk - 1;
    if (rule == 1 || (rule == 2 && lcausal)) h = min(h, floordiv(qx - bkx, akx));  // kx <= qx
    if (rule == 2) {  // |qx - kx| < wx
      l = max(l, -floordiv(-(qx - wx + 1 - bkx), akx));  // ceil
      h = min(h, floordiv(qx + wx - 1 - bkx, akx));
    }
    lo = l;
    hi = max(h, -1);
  }
  // [lo, hi]: the queries that attend key n (the transpose of key_interval), for one_interval().
  __device__ __forceinline__ void query_interval(int n, int nq, int& lo, int& hi) const {
    const int kx = n * akx + bkx;
    int l = 0, h = nq - 1;
    if (rule == 1 || (rule == 2 && lcausal)) l = max(l, -floordiv(-(kx - bqx), aqx));  // qx >= kx
    if (rule == 2) {
      l = max(l, -floordiv(-(kx - wx + 1 - bqx), aqx));
      h = min(h, floordiv(kx + wx - 1 - bqx, aqx));
    }
    lo = l;
    hi = max(h, -1);
  }

  // Range of positions along each dimension covered by flattened indices [n0, n1] (inclusive).
  __device__ __forceinline__ static void ranges(int n0, int n1, int lx, int ay, int by, int ax, int bx,
                                                 i64& y0, i64& y1, i64& x0, i64& x1) {
    int iy0 = n0 / lx, iy1 = n1 / lx;
    y0 = (i64)iy0 * ay + by;
    y1 = (i64)iy1 * ay + by;
    if (iy0 == iy1) {
      x0 = (i64)(n0 - iy0 * lx) * ax + bx;
      x1 = (i64)(n1 - iy1 * lx) * ax + bx;
    } else {
      x0 = bx;
      x1 = (i64)(lx - 1) * ax + bx;
    }
  }

  // Classify the tile of queries [q0, q1] x keys [k0, k1] (inclusive, in range):
  // 0 = no pair attended (skip), 1 = some pairs (evaluate per element), 2 = every pair attended.
  __device__ __forceinline__ int tile(int q0, int q1, int k0, int k1) const {
    if (rule == 0) return 2;
    if (rule == 1 || lcausal) {
      // Flat indices grow with the flattened index (row-major, strictly increasing positions).
      if (qflat(q1) < kflat(k0)) return 0;
      if (rule == 1) return qflat(q0) >= kflat(k1) ? 2 : 1;
    }
    i64 qy0, qy1, qx0, qx1, ky0, ky1, kx0, kx1;
    ranges(q0, q1, lqx, aqy, bqy, aqx, bqx, qy0, qy1, qx0, qx1);
    ranges(k0, k1, lkx, aky, bky, akx, bkx, ky0, ky1, kx0, kx1);
    i64 dy = ky0 > qy1 ? ky0 - qy1 : (qy0 > ky1 ? qy0 - ky1 : 0);
    i64 dx = kx0 > qx1 ? kx0 - qx1 : (qx0 > kx1 ? qx0 - kx1 : 0);
    if (dy >= ((i64)wy << log2s) || dx >= ((i64)wx << log2s)) return 0;
    return 1;
  }
};

// Class (0 skip, 1 partial, 2 full, as Mask::tile) of the tile of columns [c0, c1] for a block of
// rows whose attended-column intervals [lo(r), hi(r)] grow with r (one_interval requests): (lo0, hi0)
// is its first row's interval, (lo1, hi1) its last's. Four compares instead of Mask::tile's position
// arithmetic. A partial answer may, in corner cases (scaled positions with a window narrower than
// the position step), be a tile no pair of which is attended: it is computed, all masked, which is
// correct, only not skipped.
__device__ __forceinline__ int interval_class(int lo0, int hi0, int lo1, int hi1, int c0, int c1) {
  if (c1 < lo0 || c0 > hi1) return 0;
  return (lo1 <= c0 && hi0 >= c1) ? 2 : 1;
}

// 2^x with the SFU instruction (relative error ~2^-22: below the half-precision output rounding; the
// float32 kernels' error budget is in docs/backends/cuda.md).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Classes of the tiles of columns [c0, c1] that meet one block of rows [r0, r1]: for one_interval()
// requests from the block's first and last rows' intervals (interval_class), else from positions
// (Mask::tile). ROWS_ARE_QUERIES: rows are queries and columns keys (forward, dQ); otherwise rows
// are keys and columns queries (dK/dV).
template <bool ROWS_ARE_QUERIES>
struct TileClasses {
  const Mask& m;
  int r0, r1, lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
  bool iv;
  __device__ __forceinline__ TileClasses(const Mask& mask, int row0, int row1, int nq, int nk)
      : m(mask), r0(row0), r1(row1), iv(mask.one_interval(nq, nk)) {
    if (iv) {
      if (ROWS_ARE_QUERIES) {
        m.key_interval(r0, nk, lo0, hi0);
        m.key_interval(r1, nk, lo1, hi1);
      } else {
        m.query_interval(r0, nq, lo0, hi0);
        m.query_interval(r1, nq, lo1, hi1);
      }
    }
  }
  __device__ __forceinline__ int operator()(int c0, int c1) const {
    if (iv) return interval_class(lo0, hi0, lo1, hi1, c0, c1);
    return ROWS_ARE_QUERIES ? m.tile(r0, r1, c0, c1) : m.tile(c0, c1, r0, r1);
  }
};

// The key tiles of BN_ keys that a block of query rows [q0, q1] walks (forward, dQ): cls(jt) is tile
// jt's class (0: every pair masked, skipped; 1: partly attended; 2: all attended), live(jt) the
// first tile at or after jt that is not skipped (nkt when none is left).
template <int BN_>
struct KeyTiles {
  const TileClasses<true> classes;
  const int nk, nkt;
  __device__ __forceinline__ KeyTiles(const Mask& m, int q0, int q1, int nq, int nk_)
      : classes(m, q0, q1, nq, nk_), nk(nk_), nkt((nk_ + BN_ - 1) / BN_) {}
  __device__ __forceinline__ int cls(int jt) const {
    const int k0 = jt * BN_;
    return classes(k0, min(k0 + BN_, nk) - 1);
  }
  __device__ __forceinline__ int live(int jt) const {
    while (jt < nkt && cls(jt) == 0) ++jt;
    return jt;
  }
};

// The tensor-core kernels' block position: (tile, head, batch) from a grid laid out (heads, batch,
// tiles) when tile_major (the host's choice, launch order: every head's first tile first), else
// (tiles, heads, batch) (one head's tiles next to each other).
struct GridPos {
  int tile, head, batch;
  __device__ __forceinline__ explicit GridPos(int tile_major)
      : tile(tile_major ? blockIdx.z : blockIdx.x),
        head(tile_major ? blockIdx.x : blockIdx.y),
        batch(tile_major ? blockIdx.y : blockIdx.z) {}
};

// The Mask's 16 int32 fields travel as 8 int64 launch parameters, two fields each (low word first;
// attnhub_backends/cuda/mask.py packs them), which keeps every kernel at 40 parameters or fewer.
__device__ __forceinline__ int lo32(i64 x) { return (int)(unsigned)(unsigned long long)x; }
__device__ __forceinline__ int hi32(i64 x) { return (int)(x >> 32); }
#define MASK_PARAMS i64 mk0, i64 mk1, i64 mk2, i64 mk3, i64 mk4, i64 mk5, i64 mk6, i64 mk7
#define MASK_INIT                                                                                      \
  {lo32(mk0), hi32(mk0), lo32(mk1), hi32(mk1), lo32(mk2), hi32(mk2), lo32(mk3), hi32(mk3), lo32(mk4), \
   hi32(mk4), lo32(mk5), hi32(mk5), lo32(mk6), hi32(mk6), lo32(mk7), hi32(mk7)}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  u32 s = (u32)__cvta_generic_to_shared(smem);
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async16_a(u32 s, const void* gmem, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ double to_f(double x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T from_d(double x);
template <> __device__ __forceinline__ double from_d<double>(double x) { return x; }

// Storage type T and accumulation type ACC of the SIMT kernels, chosen by ATT_DTYPE:
// 0 float16, 1 bfloat16, 2 float32, 3 float64.
#if defined(ATT_DTYPE)
#if ATT_DTYPE == 0
typedef __half T;
typedef float ACC;
#elif ATT_DTYPE == 1
typedef __nv_bfloat16 T;
typedef float ACC;
#elif ATT_DTYPE == 2
typedef float T;
typedef float ACC;
#else
typedef double T;
typedef double ACC;
#endif
#endif

// O_F32 = 1: the output is written in float32 (kept for the backward's rowsum(dO * O), see
// Backend.forward_for_grad); otherwise in the input type T.
#if defined(ATT_DTYPE)
#ifndef O_F32
#define O_F32 0
#endif
#if O_F32
typedef float OT;
#else
typedef T OT;
#endif
#endif

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return logf(x); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }
__device__ __forceinline__ float acc_inf(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double acc_inf(double) { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ T store_t(ACC x) {
#if ATT_DTYPE == 3
  return x;
#else
  return from_f<T>(x);
#endif
}

// Score modifiers (SPEC §9), compiled in only when the host defines MODS (bit 1: softcap, bit 2: an
// additive bias, bit 4: the backward records dS per pair for dbias). Without MODS, MOD_PARAMS is
// empty and no kernel changes: the dense variants compile to the same code.
#ifndef MODS
#define MODS 0
#endif
#if MODS
__device__ __forceinline__ float acc_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double acc_tanh(double x) { return tanh(x); }

// Kernel arguments: the bias (A, rank 4, (batch, head, query, key) strides, 0 on broadcast axes),
// the softcap (0 without) and the dS buffer (A, (B, Hq, Nq, Nk) contiguous, zeroed; null without).
#define MOD_PARAMS                                                                                     \
  , const void* __restrict__ mod_bias, i64 mod_sb, i64 mod_sh, i64 mod_sq, i64 mod_sk, double mod_cap, \
      void* __restrict__ mod_ds
#define MOD_ARGS mod_bias, mod_sb, mod_sh, mod_sq, mod_sk, mod_cap, mod_ds

// One (batch, head)'s modifiers in the kernel's logit domain: dom = 1 (natural logits, SIMT kernels)
// or log2(e) (the tensor-core kernels' exp2 domain); softcap and bias are scaled by it.
template <typename A>
struct Mods {
  const A* bias;
  i64 sq, sk;
  A cap;
  A dom;
  A* ds;
  int Nk;
  __device__ __forceinline__ Mods(const void* bias_p, i64 sb, i64 sh, i64 sq_, i64 sk_, double cap_d, void* ds_p,
                                  int b, int h, int Hq, int Nq, int Nk_, A dom_)
      : bias(bias_p ? reinterpret_cast<const A*>(bias_p) + b * sb + h * sh : nullptr),
        sq(sq_),
        sk(sk_),
        cap((A)cap_d * dom_),
        dom(dom_),
        ds(ds_p ? reinterpret_cast<A*>(ds_p) + ((i64)b * Hq + h) * Nq * Nk_ : nullptr),
        Nk(Nk_) {}
  // The modified logit of pair (qi, kj) from its scaled logit u; th = tanh(u / cap) for grad().
  __device__ __forceinline__ A apply(A u, int qi, int kj, A& th) const {
#if MODS & 1
    th = acc_tanh(u / cap);
    u = cap * th;
#else
    th = 0;
#endif
#if MODS & 2
    u += bias[qi * sq + kj * sk] * dom;
#endif
    return u;
  }
  // dS of the scaled logit from dS of the modified one (recorded for dbias).
  __device__ __forceinline__ A grad(A d, A th, int qi, int kj) const {
#if MODS & 4
    ds[(i64)qi * Nk + kj] = d;
#endif
#if MODS & 1
    d *= (A)1 - th * th;
#endif
    return d;
  }
};
#else
#define MOD_PARAMS
#endif
