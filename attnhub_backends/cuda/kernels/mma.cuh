// attnhub CUDA backend: tensor-core helpers shared by the float16 / bfloat16 kernels (sm_80+):
// mma.sync m16n8k16, ldmatrix, XOR-swizzled shared-memory tiles filled with cp.async.
#pragma once

#if ATT_DTYPE == 1
#define MMA_T "bf16"
__device__ __forceinline__ u32 pack2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<u32*>(&h);
}
#else
#define MMA_T "f16"
__device__ __forceinline__ u32 pack2(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<u32*>(&h);
}
#endif



__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(u32* r, const void* p) {
  u32 s = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, const void* p) {
  u32 s = (u32)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// The same with a shared-memory address (bytes): callers precompute a lane's swizzled offset once
// and reach the other fragments by XOR / add of compile-time constants (see fwd_mma.cu).
__device__ __forceinline__ void ldsm_x4_a(u32* r, u32 s) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t_a(u32* r, u32 s) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Element offset of (row, 16-byte chunk) in a swizzled tile whose rows hold D elements.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Copy rows [row0, row0 + R) of a (N, D) matrix with row stride `ld` into a swizzled tile; rows past
// N are zero-filled. Each thread copies one 16-byte chunk column of every RS-th row: its global
// pointer and its swizzled shared offset advance by constants (RS is a multiple of 8, so the
// swizzle pattern of its rows repeats).
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(T* s, const T* g, i64 ld, int row0, int n, int tid) {
  constexpr int CH = D / 8;
  constexpr int RS = NT / CH;
  if constexpr (NT % CH == 0 && RS % 8 == 0) {
    const int r0 = tid / CH, ch = tid % CH;
    const T* src = g + (i64)(row0 + r0) * ld + ch * 8;
    const i64 step = (i64)RS * ld;
    const u32 dst = smem_u32(s + swz<D>(r0, ch));
#pragma unroll
    for (int i = 0; i < (R + RS - 1) / RS; ++i) {
      if (R % RS == 0 || r0 + i * RS < R) {
        const bool ok = row0 + r0 + i * RS < n;
        cp_async16_a(dst + i * (RS * D * 2), ok ? src : g, ok);
      }
      src += step;
    }
  } else {
#pragma unroll
    for (int c = tid; c < R * CH; c += NT) {
      int r = c / CH, ch = c % CH;
      int gr = row0 + r;
      bool ok = gr < n;
      const T* src = ok ? g + (i64)gr * ld + ch * 8 : g;
      cp_async16(s + swz<D>(r, ch), src, ok);
    }
  }
}
