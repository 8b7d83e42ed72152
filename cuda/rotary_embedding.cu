// rotary_embedding.cu -- ONNX RotaryEmbedding (opset 23), every layout:
//   X rank 4 (B, H, S, D) or rank 3 (B, S, H*D); halves (x[i], x[i + rd/2]) or interleaved
//   pairs (x[2i], x[2i+1]); partial rotation (the first rd features of each head, the rest
//   copied); caches (P, rd/2) gathered by position_ids (B, S), or (B, S, rd/2) without them.
//   float32 / float16 / bfloat16, computed in float32 and rounded once.
//
// Memory bound: X is read once and Y written once with W-element vector accesses (W = 1,
// 2, 4, 8; at most 16 bytes); the caches are small and shared by the H heads of a token
// (they stay in L2/L1).
//
// The tensor is seen as `rows` head vectors of D elements in memory order.  Row r holds
// batch b = r / (H*S) and position s = (r / s_div) % S, with s_div = 1 for rank 4 (rows run
// over (b, h, s)) and H for rank 3 (rows run over (b, s, h)).  A row is cut into `units`:
// rd/2 / NP rotation units of NP pairs each, followed by (D - rd) / W copy units of W
// elements.  Halves: NP = W (x[i..i+W) and x[i+rd/2..) are one access each).  Interleaved:
// a unit's 2 NP elements are consecutive, NP = W/2 for W >= 2 (one access), and NP = 1 for
// W = 1 (two scalar accesses: odd head sizes, misaligned views).  Threads: threadIdx.x
// walks the units of a row, threadIdx.y picks the row inside the block.
//
// Alignment (checked by the host before it picks W): X and Y aligned to W elements, the
// caches to NP elements, D a multiple of W, rd/2 a multiple of NP; every access is then
// aligned to its size, and every element of Y is written exactly once.
//
// A position id outside [0, max_pos) yields NaN for that token's rotated features (the host
// validates and raises before launching; the kernel only guarantees memory safety).
#include "common/gk_common.cuh"

template <class T, int W, bool INTERLEAVED, bool HAS_POS>
__global__ void __launch_bounds__(256)
gk_rotary(const T* __restrict__ x, const T* __restrict__ cos_cache, const T* __restrict__ sin_cache,
          const long long* __restrict__ position_ids, T* __restrict__ y,
          gk::i64 rows, int D, int rd, int H, int S, int s_div, gk::i64 max_pos) {
  constexpr int NP = INTERLEAVED ? (W >= 2 ? W / 2 : 1) : W;  // pairs of one rotation unit
  constexpr int NA = INTERLEAVED ? 2 * NP / W : 1;            // X accesses per interleaved unit
  const gk::i64 row = (gk::i64)blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const int half = rd >> 1;
  const int rot_units = half / NP;
  const int units = rot_units + (D - rd) / W;
  const gk::i64 b = row / ((gk::i64)H * S);
  const int s = (int)((row / s_div) % S);
  const gk::i64 token = b * S + s;
  gk::i64 pos = token;
  bool valid = true;
  if (HAS_POS) {
    pos = position_ids[token];
    valid = pos >= 0 && pos < max_pos;
    if (!valid) pos = 0;
  }
  const T* xr = x + row * D;
  T* yr = y + row * D;
  const T* cr = cos_cache + pos * half;
  const T* sr = sin_cache + pos * half;
  const float poison = valid ? 1.0f : __int_as_float(0x7fc00000);

  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    if (u < rot_units) {
      const int i = u * NP;  // first pair of this unit
      float c[NP], sn[NP];
      gk::load_as_float<T, NP>(cr + i, c);
      gk::load_as_float<T, NP>(sr + i, sn);
      if (INTERLEAVED) {
        float v[2 * NP], o[2 * NP];
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          float t[W];
          gk::load_as_float<T, W>(xr + 2 * i + a * W, t);
#pragma unroll
          for (int k = 0; k < W; ++k) v[a * W + k] = t[k];
        }
#pragma unroll
        for (int k = 0; k < NP; ++k) {
          const float a = v[2 * k], bb = v[2 * k + 1];
          o[2 * k] = (c[k] * a - sn[k] * bb) * poison;
          o[2 * k + 1] = (sn[k] * a + c[k] * bb) * poison;
        }
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          float t[W];
#pragma unroll
          for (int k = 0; k < W; ++k) t[k] = o[a * W + k];
          gk::store_from_float<T, W>(yr + 2 * i + a * W, t);
        }
      } else {
        float a[NP], bb[NP], o1[NP], o2[NP];
        gk::load_as_float<T, NP>(xr + i, a);
        gk::load_as_float<T, NP>(xr + i + half, bb);
#pragma unroll
        for (int k = 0; k < NP; ++k) {
          o1[k] = (c[k] * a[k] - sn[k] * bb[k]) * poison;
          o2[k] = (sn[k] * a[k] + c[k] * bb[k]) * poison;
        }
        gk::store_from_float<T, NP>(yr + i, o1);
        gk::store_from_float<T, NP>(yr + i + half, o2);
      }
    } else {
      const int e = rd + (u - rot_units) * W;
      gk::store_vec<T, W>(yr + e, gk::load_vec<T, W>(xr + e));
    }
  }
}
