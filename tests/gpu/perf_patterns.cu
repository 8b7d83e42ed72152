// perf_patterns.cu -- access patterns with known bank-conflict ways and sector counts, for
// the emulator's performance counters (tests/gpu/test_emu_perf.py).  One warp; each
// checked access is on its own line, tagged with a comment the test looks up (P.. shared,
// G.. global, L.. ldmatrix, C.. cp.async).  Emulator only (not a shipped kernel).
#include "common/gk_common.cuh"
#include "common/mma.cuh"

extern "C" __global__ void gk_perf_patterns(const float* __restrict__ g, float* __restrict__ out) {
  __shared__ __align__(16) float s[32 * 33 + 64];
  __shared__ __align__(16) __half hs[32 * 72];
  __shared__ __align__(16) float cs[32 * 4];
  const int t = threadIdx.x;  // one warp
  for (int i = t; i < 32 * 33 + 64; i += 32) s[i] = 0.0f;
  for (int i = t; i < 32 * 72; i += 32) hs[i] = __float2half(0.0f);
  __syncthreads();
  float acc = 0.0f;
  acc += s[t * 32];          // P1: 32-way
  acc += s[t * 33 + 1];      // P2: conflict-free (odd stride)
  acc += s[t * 2 + 2];       // P3: 2-way
  acc += s[5];               // P4: broadcast, conflict-free
  acc += s[(t & 15) * 32 + 3];  // P5: 16-way (lanes t and t + 16 share a word)
  float4 v = *reinterpret_cast<const float4*>(s + 4 * t);  // P6: 16-byte, consecutive: 4 phases, 1-way
  float4 w = *reinterpret_cast<const float4*>(s + 8 * t + 4);  // P7: 16-byte, 32-byte stride: 2-way
  float2 x = *reinterpret_cast<const float2*>(s + 2 * t + 64);  // P8: 8-byte, consecutive: 2 phases, 1-way
  if (t < 16) acc += s[t * 32 + 6];  // P9: 16 active lanes, 16-way
  for (int r = 0; r < 4; ++r) {
    acc += s[64 + r];                       // P10: every lane, every iteration (broadcast)
    if (t < 8 * r) acc += s[t * 32 + 7 + r];  // P11: 8, 16, 24 lanes in iterations 1..3: 8/16/24-way
  }
  acc += g[t];                     // G1: 4 sectors (ideal 4)
  acc += g[2 * t + 256];           // G2: 8 sectors (ideal 4)
  acc += g[32 * t + 1];            // G3: 32 sectors (ideal 4)
  acc += g[3];                     // G4: 1 sector (ideal 1)
  float4 gv = *reinterpret_cast<const float4*>(g + 4 * t + 512);  // G5: 16 sectors (ideal 16)
  acc += g[t + 1];                 // G6: 5 sectors (ideal 4: misaligned by one float)
  unsigned r0[4], r1[4];
  gk::ldmatrix_x4(r0, hs + t * 64);  // L1: rows 128 bytes apart: 8-way
  gk::ldmatrix_x4(r1, hs + t * 72);  // L2: rows 144 bytes apart: conflict-free
  gk::cp_async_16(cs + 4 * t, g + 4 * t + 1024);  // C1: 16 sectors (ideal 16), shared 1-way
  gk::cp_async_commit();
  gk::cp_async_wait<0>();
  __syncthreads();
  out[t] = acc + v.x + w.y + x.x + gv.z + cs[4 * t] + __uint_as_float(r0[0] ^ r1[1]);  // G7: 4 sectors
}
