// gk_common.cuh -- shared device helpers of gpukernels' CUDA sources.
//
// Compiles three ways: NVRTC (through CuPy at run time, or gpukernels.gpu.compile_check),
// nvcc, and g++ with the CPU emulator (tools/cuda_emu/cuda_emu.h defines GK_EMULATOR).
// Keep every source free of host standard headers: NVRTC has none.
//
//   gk::i64 / gk::u64            64-bit offsets (use them wherever a tensor can exceed 2^31)
//   gk::to_float / from_float<T>  float <-> float / __half / __nv_bfloat16 (round to nearest even)
//   gk::Vec<T, N>, load_vec, store_vec  N elements moved as one aligned transaction
//   gk::load_as_float / store_from_float  N elements converted to / from float registers
//   gk::warp_sum / warp_max       butterfly reductions over a full warp (all 32 lanes must call)
//   gk::ceil_div, gk::select_t<cond, T, F>
#pragma once
#ifndef GK_COMMON_CUH
#define GK_COMMON_CUH

#ifndef GK_EMULATOR
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

namespace gk {

typedef long long i64;
typedef unsigned long long u64;

template <class T>
__device__ __forceinline__ T ceil_div(T a, T b) { return (a + b - 1) / b; }

// std::conditional without <type_traits> (NVRTC has no standard headers).
template <bool B, class T, class F> struct select_type { typedef T type; };
template <class T, class F> struct select_type<false, T, F> { typedef F type; };
template <bool B, class T, class F> using select_t = typename select_type<B, T, F>::type;

// ------------------------------------------------------------------ conversions
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// ------------------------------------------------------------------ vector memory access
// Vec<T, N>: N consecutive elements, aligned to their total size (at most 16 bytes), so that
// a load or store is one LDG/STG.{32,64,128}.  The host checks pointer alignment and that
// the row length is a multiple of N before choosing N > 1.
template <class T, int N>
struct __align__(sizeof(T) * N) Vec {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}
// N floats from shared memory at p (one float4 / float2 load when N is 4 / 2; p aligned).
template <int N>
__device__ __forceinline__ void lds(const float* p, float* out) {
  if constexpr (N == 4) {
    float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  } else if constexpr (N == 2) {
    float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x; out[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = p[i];
  }
}

template <class T, int N>
__device__ __forceinline__ void load_as_float(const T* p, float (&out)[N]) {
  Vec<T, N> v = load_vec<T, N>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(v.v[i]);
}
template <class T, int N>
__device__ __forceinline__ void store_from_float(T* p, const float (&in)[N]) {
  Vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = from_float<T>(in[i]);
  store_vec<T, N>(p, v);
}

// ------------------------------------------------------------------ warp reductions
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over lanes in groups of `width` consecutive lanes (width a power of two <= 32).
__device__ __forceinline__ float group_sum(float x, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o, width);
  return x;
}

}  // namespace gk

#endif  // GK_COMMON_CUH
