// selftest.cu -- small kernels that pin down the semantics the other kernels rely on:
// warp shuffles and votes, block barriers, dynamic shared memory, atomics, and the
// tensor-core layer of common/mma.cuh (mma.sync, ldmatrix, cp.async).  They run in the
// CPU emulator in CI and on a GPU in scripts/gpu_check.sh: agreement of the two is what
// makes emulator results for the real kernels trustworthy.
#include "common/gk_common.cuh"
#include "common/mma.cuh"

// One float per thread (blockDim.x a multiple of 32).  out has 8 floats per thread:
// warp_sum, shfl(lane*7 % 32), shfl_up(3), shfl_down(5), shfl_xor(6, width 16),
// ballot(x > 0) as float bits, any(x > 2), all(x > -3).
extern "C" __global__ void gk_selftest_warp(const float* __restrict__ x, float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x & 31;
  float v = i < n ? x[i] : 0.0f;
  float s = gk::warp_sum(v);
  float a = __shfl_sync(0xffffffffu, v, (lane * 7) % 32);
  float b = __shfl_up_sync(0xffffffffu, v, 3);
  float c = __shfl_down_sync(0xffffffffu, v, 5);
  float d = __shfl_xor_sync(0xffffffffu, v, 6, 16);
  unsigned bal = __ballot_sync(0xffffffffu, v > 0.0f);
  int any = __any_sync(0xffffffffu, v > 2.0f);
  int all = __all_sync(0xffffffffu, v > -3.0f);
  if (i < n) {
    float* o = out + (gk::i64)i * 8;
    o[0] = s;
    o[1] = a;
    o[2] = b;
    o[3] = c;
    o[4] = d;
    o[5] = __uint_as_float(bal);
    o[6] = (float)any;
    o[7] = (float)all;
  }
}

// Block sums through dynamic shared memory (blockDim.x floats), a grid-wide atomic sum in
// total[0], and __syncthreads_count(x > 0) per block in counts[block].
extern "C" __global__ void gk_selftest_block(const float* __restrict__ x, float* __restrict__ sums,
                                             float* __restrict__ total, int* __restrict__ counts, int n) {
  extern __shared__ float smem[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  smem[threadIdx.x] = v;
  int c = __syncthreads_count(v > 0.0f);
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if ((int)threadIdx.x < stride) smem[threadIdx.x] += smem[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = smem[0];
    counts[blockIdx.x] = c;
    atomicAdd(total, smem[0]);
  }
}

// D (16x16) = A (16x16) * B (16x16) + C with f16 (KIND 0) or bf16 (KIND 1) inputs: A and B
// are rounded into shared memory (cp.async for the C tile), fragments come from ldmatrix /
// ldmatrix.trans, two m16n8k16 products.  One warp.
template <int KIND>
__global__ void gk_selftest_mma16(const float* __restrict__ A, const float* __restrict__ B,
                                  const float* __restrict__ C, float* __restrict__ D) {
  typedef gk::select_t<KIND == 0, __half, __nv_bfloat16> H;
  __shared__ __align__(16) H As[16 * 16];
  __shared__ __align__(16) H Bs[16 * 16];
  __shared__ __align__(16) float Cs[16 * 16];
  int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) {
    As[e] = gk::from_float<H>(A[e]);
    Bs[e] = gk::from_float<H>(B[e]);
  }
  for (int e = lane; e < 64; e += 32) gk::cp_async_16(Cs + 4 * e, C + 4 * e);
  gk::cp_async_commit();
  gk::cp_async_wait<0>();
  __syncwarp();
  int row = (lane & 7) + 8 * ((lane >> 3) & 1), col = 8 * (lane >> 4);
  unsigned a[4], b[4];
  gk::ldmatrix_x4(a, As + row * 16 + col);
  gk::ldmatrix_x4_trans(b, Bs + row * 16 + col);
  int g = lane >> 2, t = lane & 3;
  for (int nt = 0; nt < 2; ++nt) {
    float c[4] = {Cs[g * 16 + nt * 8 + 2 * t], Cs[g * 16 + nt * 8 + 2 * t + 1], Cs[(g + 8) * 16 + nt * 8 + 2 * t],
                  Cs[(g + 8) * 16 + nt * 8 + 2 * t + 1]};
    unsigned bb[2] = {b[2 * nt], b[2 * nt + 1]};
    float d[4];
    if (KIND == 0)
      gk::mma_m16n8k16_f16(d, a, bb, c);
    else
      gk::mma_m16n8k16_bf16(d, a, bb, c);
    D[g * 16 + nt * 8 + 2 * t] = d[0];
    D[g * 16 + nt * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 16 + nt * 8 + 2 * t] = d[2];
    D[(g + 8) * 16 + nt * 8 + 2 * t + 1] = d[3];
  }
}

// D (16x16) = A (16x8) * B (8x16) + C with tf32 inputs, fragments read straight from global
// memory in the documented layout.  One warp.
extern "C" __global__ void gk_selftest_mma_tf32(const float* __restrict__ A, const float* __restrict__ B,
                                                const float* __restrict__ C, float* __restrict__ D) {
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  unsigned a[4] = {gk::to_tf32(A[g * 8 + t]), gk::to_tf32(A[(g + 8) * 8 + t]), gk::to_tf32(A[g * 8 + t + 4]),
                   gk::to_tf32(A[(g + 8) * 8 + t + 4])};
  for (int nt = 0; nt < 2; ++nt) {
    int n = nt * 8 + g;
    unsigned b[2] = {gk::to_tf32(B[t * 16 + n]), gk::to_tf32(B[(t + 4) * 16 + n])};
    int c0 = nt * 8 + 2 * t;
    float c[4] = {C[g * 16 + c0], C[g * 16 + c0 + 1], C[(g + 8) * 16 + c0], C[(g + 8) * 16 + c0 + 1]};
    float d[4];
    gk::mma_m16n8k8_tf32(d, a, b, c);
    D[g * 16 + c0] = d[0];
    D[g * 16 + c0 + 1] = d[1];
    D[(g + 8) * 16 + c0] = d[2];
    D[(g + 8) * 16 + c0 + 1] = d[3];
  }
}
