// attnhub CUDA backend: pieces shared by the tensor-core backwards (bwd_mma.cu, bwd_wgmma.cu).
#pragma once

// p[0] += a, p[1] += b in global memory (8-byte aligned): one vector reduction on sm_90 (the four
// lanes of a fragment row then cover one 32-byte sector per instruction), two atomics before.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// Natural-log lse to the log2 domain; +inf for fully masked rows so that every p = exp2(s - lse) is 0.
__device__ __forceinline__ float lse2_of(float l) {
  return (l == ATT_NEG_INF) ? __int_as_float(0x7f800000) : l * 1.4426950408889634f;
}

// dq = scale * dqacc, rounded to T; n elements (a multiple of 4: rows of Dqk = 64 or 128), four per
// thread.
extern "C" __global__ void __launch_bounds__(256) attn_bwd_dq_convert(const float* __restrict__ acc,
                                                                      T* __restrict__ dq, i64 n, float scale) {
  const i64 i = 4 * ((i64)blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    const float4 a = *reinterpret_cast<const float4*>(acc + i);
    uint2 packed;
    packed.x = pack2(a.x * scale, a.y * scale);
    packed.y = pack2(a.z * scale, a.w * scale);
    *reinterpret_cast<uint2*>(dq + i) = packed;
  }
}
