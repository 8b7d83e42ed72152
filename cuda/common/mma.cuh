// mma.cuh -- a thin layer over the tensor-core and async-copy instructions, with a portable
// implementation of identical fragment semantics for the CPU emulator (GK_EMULATOR).
//
// Kernels use only these functions for warp-level matrix products; on sm_80/sm_90 they are
// single PTX instructions (mma.sync, ldmatrix, cp.async).  In the emulator every call is a
// warp collective: all 32 lanes must call it together (as on the GPU), the fragments of the
// whole warp are gathered, the product is computed in float32 and scattered back in the
// same layout.  Tests of a kernel in the emulator therefore check its fragment indexing.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8"),
// with g = lane >> 2 and t = lane & 3; a u32 register holds two 16-bit values, the lower
// column (or row for B) in the low half:
//   m16n8k16 (f16 / bf16 inputs, f32 accumulators), A 16x16 row-major, B 16x8 "col":
//     a[0] = A[g][2t..2t+1]     a[1] = A[g+8][2t..2t+1]
//     a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//     b[0] = B[2t..2t+1][g]     b[1] = B[2t+8..2t+9][g]
//   m16n8k8 (tf32 inputs, f32 accumulators), A 16x8, B 8x8 (one tf32 per register):
//     a[0] = A[g][t]  a[1] = A[g+8][t]  a[2] = A[g][t+4]  a[3] = A[g+8][t+4]
//     b[0] = B[t][g]  b[1] = B[t+4][g]
//   C / D (both shapes, 16x8 f32):
//     c[0], c[1] = C[g][2t], C[g][2t+1]     c[2], c[3] = C[g+8][2t], C[g+8][2t+1]
//
//   ldmatrix_x4(r, p): lane l passes the address of row (l & 7) of 8x8 b16 matrix (l >> 3)
//     (16 bytes each, in shared memory); r[i] = matrix i, row l >> 2, columns 2(l & 3), +1.
//     ldmatrix_x4_trans: r[i] = matrix i, rows 2(l & 3), +1, column l >> 2 (the transpose).
//   cp_async_16(dst_smem, src_gmem, src_bytes = 16): copy 16 bytes (zero-fill past
//     src_bytes); cp_async_commit(); cp_async_wait<N>() waits until at most N groups pend.
#pragma once
#ifndef GK_MMA_CUH
#define GK_MMA_CUH

#include "gk_common.cuh"

namespace gk {

// ------------------------------------------------------------------ packing helpers
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned pack_bf162(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
// Round a float to TF32 (10 mantissa bits, nearest, ties away from zero), as a u32 register.
__device__ __forceinline__ unsigned to_tf32(float x) {
#ifdef GK_EMULATOR
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
#else
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}

#ifdef GK_EMULATOR
namespace emu {
struct MmaIn {
  unsigned a[4];
  unsigned b[2];
  float c[4];
};
template <int KIND>  // 0 f16, 1 bf16, 2 tf32
inline float element(unsigned reg, int half) {
  if (KIND == 2) return __uint_as_float(reg & 0xffffe000u);  // the tensor core ignores low bits
  unsigned short bits = (unsigned short)(half ? (reg >> 16) : (reg & 0xffffu));
  return KIND == 0 ? gk_emu::f16_bits_to_f32(bits) : gk_emu::bf16_bits_to_f32(bits);
}
template <int KIND>
inline void mma_fn(const gk_emu::LaneSlot* s, unsigned parts, void*) {
  if (parts != 0xffffffffu) gk_emu::fail("mma: all 32 lanes of the warp must take part");
  const int K = KIND == 2 ? 8 : 16;
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const MmaIn* in = static_cast<const MmaIn*>(s[l].in);
    int g = l >> 2, t = l & 3;
    if (KIND == 2) {
      A[g][t] = element<2>(in->a[0], 0);
      A[g + 8][t] = element<2>(in->a[1], 0);
      A[g][t + 4] = element<2>(in->a[2], 0);
      A[g + 8][t + 4] = element<2>(in->a[3], 0);
      B[t][g] = element<2>(in->b[0], 0);
      B[t + 4][g] = element<2>(in->b[1], 0);
    } else {
      for (int h = 0; h < 2; ++h) {
        A[g][2 * t + h] = element<KIND>(in->a[0], h);
        A[g + 8][2 * t + h] = element<KIND>(in->a[1], h);
        A[g][2 * t + 8 + h] = element<KIND>(in->a[2], h);
        A[g + 8][2 * t + 8 + h] = element<KIND>(in->a[3], h);
        B[2 * t + h][g] = element<KIND>(in->b[0], h);
        B[2 * t + 8 + h][g] = element<KIND>(in->b[1], h);
      }
    }
    C[g][2 * t] = in->c[0];
    C[g][2 * t + 1] = in->c[1];
    C[g + 8][2 * t] = in->c[2];
    C[g + 8][2 * t + 1] = in->c[3];
  }
  for (int l = 0; l < 32; ++l) {
    float* d = static_cast<float*>(s[l].out);
    int g = l >> 2, t = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8};
    const int cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i) {
      float acc = C[rows[i]][cols[i]];
      for (int k = 0; k < K; ++k) acc += A[rows[i]][k] * B[k][cols[i]];
      d[i] = acc;
    }
  }
}
template <int KIND>
inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
  MmaIn in;
  for (int i = 0; i < 4; ++i) in.a[i] = a[i], in.c[i] = c[i];
  in.b[0] = b[0];
  in.b[1] = b[1];
  float out[4];
  gk_emu::warp_collective(0xffffffffu, &in, out, mma_fn<KIND>, nullptr, "mma.sync");
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}
template <bool TRANS>
inline void ldmatrix_fn(const gk_emu::LaneSlot* s, unsigned parts, void*) {
  if (parts != 0xffffffffu) gk_emu::fail("ldmatrix: all 32 lanes of the warp must take part");
  for (int l = 0; l < 32; ++l) {
    unsigned* r = static_cast<unsigned*>(s[l].out);
    for (int m = 0; m < 4; ++m) {
      unsigned short v[2];
      for (int h = 0; h < 2; ++h) {
        int row = TRANS ? 2 * (l & 3) + h : (l >> 2);
        int col = TRANS ? (l >> 2) : 2 * (l & 3) + h;
        const unsigned short* rowp = *static_cast<const unsigned short* const*>(s[8 * m + row].in);
        v[h] = rowp[col];
      }
      r[m] = (unsigned)v[0] | ((unsigned)v[1] << 16);
    }
  }
}
}  // namespace emu
#endif

// D = A * B + C, f16 inputs.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4]) {
#ifdef GK_EMULATOR
  emu::mma<0>(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}
// D = A * B + C, bf16 inputs.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                  const float (&c)[4]) {
#ifdef GK_EMULATOR
  emu::mma<1>(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}
// D = A * B + C, tf32 inputs (registers from to_tf32).
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4]) {
#ifdef GK_EMULATOR
  emu::mma<2>(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

// Four 8x8 b16 matrices from shared memory (see the layout above).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem_row) {
#ifdef GK_EMULATOR
  gk_emu::warp_collective(0xffffffffu, &smem_row, r, emu::ldmatrix_fn<false>, nullptr, "ldmatrix");
#else
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem_row) {
#ifdef GK_EMULATOR
  gk_emu::warp_collective(0xffffffffu, &smem_row, r, emu::ldmatrix_fn<true>, nullptr, "ldmatrix.trans");
#else
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// Asynchronous 16-byte global -> shared copy (sm_80+); bytes past src_bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
#ifdef GK_EMULATOR
  unsigned char* d = static_cast<unsigned char*>(smem_dst);
  const unsigned char* s = static_cast<const unsigned char*>(gmem_src);
  for (int i = 0; i < 16; ++i) d[i] = i < src_bytes ? s[i] : 0;
#else
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem_src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef GK_EMULATOR
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef GK_EMULATOR
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ------------------------------------------------------------------ fragment policies
// TensorCore<T>: one warp's tensor-core product of operands of type T held in shared memory,
// so that a kernel is written once for every input type:
//   __half, __nv_bfloat16  m16n8k16 (KS = 16), fragments through ldmatrix;
//   float                  TF32 m16n8k8 (KS = 8), every element rounded with to_tf32 (to
//                          nearest, as cuBLAS / cuDNN do), fragments by 32-bit shared loads.
// A tile is given by its first element p and leading dimension ld (elements); all 32 lanes
// call together, lane = threadIdx.x & 31.
//   load_a(a, p, ld, lane)          A (16 x KS), row-major: A[m][k] = p[m * ld + k]
//   load_b_kn(b0, b1, p, ld, lane)  B of two n8 tiles (KS x 16), B[k][n] = p[k * ld + n];
//                                   b0: n 0-7, b1: n 8-15
//   load_b_nk(b0, b1, p, ld, lane)  the same from B[k][n] = p[n * ld + k] (k contiguous), the
//                                   columns of each n8 tile in the order of acc_col
//   mma(d, a, b)                    d += A B (float32 accumulators, the C/D layout above)
//   acc_col(t, e)                   after load_b_nk: the column (within its n8 tile) of
//                                   accumulator element e (0, 1; rows g and g + 8 alike) of
//                                   the lanes with t = lane & 3.  f16 / bf16: 2t + e (natural
//                                   order); float: t + 4e -- load_b_nk permutes the columns
//                                   so that a lane's accumulators are the A elements it needs
//                                   in a following m16n8k8 product (a[0] / a[2]: columns t,
//                                   t + 4): a chained product (attention's P V after S = Q K^T)
//                                   takes its A operand straight from the accumulators.
// Bank conflicts: ldmatrix reads 8 rows of 16 bytes per phase, conflict-free when
// ld * sizeof(T) is an odd multiple of 16 bytes; float load_a / load_b_nk read rows g and
// columns t (conflict-free when ld = 4 mod 8), float load_b_kn rows t and columns g
// (conflict-free when ld = 8 mod 16).
__device__ __forceinline__ void mma_tc(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const __half*) {
  mma_m16n8k16_f16(d, a, b, d);
}
__device__ __forceinline__ void mma_tc(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                       const __nv_bfloat16*) {
  mma_m16n8k16_bf16(d, a, b, d);
}

template <class T>
struct TensorCore {  // __half, __nv_bfloat16
  static constexpr int KS = 16;
  static __device__ __forceinline__ void load_a(unsigned (&a)[4], const T* p, int ld, int lane) {
    ldmatrix_x4(a, p + (lane & 15) * ld + (lane >> 4) * 8);
  }
  static __device__ __forceinline__ void load_b_kn(unsigned (&b0)[2], unsigned (&b1)[2], const T* p, int ld,
                                                   int lane) {
    unsigned q[4];
    ldmatrix_x4_trans(q, p + (lane & 15) * ld + (lane >> 4) * 8);
    b0[0] = q[0], b0[1] = q[1], b1[0] = q[2], b1[1] = q[3];
  }
  static __device__ __forceinline__ void load_b_nk(unsigned (&b0)[2], unsigned (&b1)[2], const T* p, int ld,
                                                   int lane) {
    unsigned q[4];
    ldmatrix_x4(q, p + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8);
    b0[0] = q[0], b0[1] = q[1], b1[0] = q[2], b1[1] = q[3];
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    mma_tc(d, a, b, static_cast<const T*>(nullptr));
  }
  static __device__ __forceinline__ constexpr int acc_col(int t, int e) { return 2 * t + e; }
};

template <>
struct TensorCore<float> {  // TF32
  static constexpr int KS = 8;
  static __device__ __forceinline__ void load_a(unsigned (&a)[4], const float* p, int ld, int lane) {
    const int g = lane >> 2, t = lane & 3;
    a[0] = to_tf32(p[g * ld + t]);
    a[1] = to_tf32(p[(g + 8) * ld + t]);
    a[2] = to_tf32(p[g * ld + t + 4]);
    a[3] = to_tf32(p[(g + 8) * ld + t + 4]);
  }
  static __device__ __forceinline__ void load_b_kn(unsigned (&b0)[2], unsigned (&b1)[2], const float* p, int ld,
                                                   int lane) {
    const int g = lane >> 2, t = lane & 3;
    b0[0] = to_tf32(p[t * ld + g]);
    b0[1] = to_tf32(p[(t + 4) * ld + g]);
    b1[0] = to_tf32(p[t * ld + 8 + g]);
    b1[1] = to_tf32(p[(t + 4) * ld + 8 + g]);
  }
  // column c of an n8 tile comes from row (c >> 1) + 4 (c & 1): lane g reads row n below
  static __device__ __forceinline__ void load_b_nk(unsigned (&b0)[2], unsigned (&b1)[2], const float* p, int ld,
                                                   int lane) {
    const int g = lane >> 2, t = lane & 3, n = (g >> 1) + 4 * (g & 1);
    b0[0] = to_tf32(p[n * ld + t]);
    b0[1] = to_tf32(p[n * ld + t + 4]);
    b1[0] = to_tf32(p[(n + 8) * ld + t]);
    b1[1] = to_tf32(p[(n + 8) * ld + t + 4]);
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    mma_m16n8k8_tf32(d, a, b, d);
  }
  static __device__ __forceinline__ constexpr int acc_col(int t, int e) { return t + 4 * e; }
};

}  // namespace gk

#endif  // GK_MMA_CUH
