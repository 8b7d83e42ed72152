// attention.cu -- fused scaled dot-product attention (ONNX Attention, opsets 23-25).
//
// The score matrix is never materialised: each block owns BM "rows" of one (batch, kv head)
// and streams the keys/values through shared memory in tiles of BN keys with an online
// softmax (flash-attention style).  Rows pack the query heads that share a kv head
// (grouped / multi-query attention): row rho of (b, hk) is query position i = rho / G of
// q head h = hk * G + rho % G, so K/V tiles are loaded once for the whole group.
//
//   gk_attn_simt<DMAX, BM>        float32, exact float32 FMAs (no TF32), 256 threads
//   gk_attn_tc<T, DMAX, NW>       tensor cores (gk::TensorCore<T>, common/mma.cuh), float32
//                                 accumulation and softmax, NW warps of 16 rows: __half /
//                                 __nv_bfloat16 (m16n8k16) and, for float32 when the context
//                                 allows TF32, float (TF32 m16n8k8, inputs rounded to nearest)
//   gk_attn_combine<T>            merges the split-KV partial results (decoding)
//   gk_attn_present<U>            present_key/value = concat(past, new) (bit copy)
//
// Semantics (gpukernels/kernels/nn/attention.py): scores = scale * Q K^T, soft-capped
// (softcap * tanh(s / softcap)), plus the additive bias (float mask, bool mask as 0/-inf,
// keys past the mask's last dimension -inf, the causal frontier j <= i + offset, the
// opset-25 window, keys >= nonpad_kv_seqlen[b]); softmax over the keys; times V.  A row whose
// bias is -inf for every key gives zeros.  offset = past length, or nonpad[b] - q_len.
//
// Key j of (b, hk) lives in past_key (j < P, contiguous (B, Hkv, P, D)) or in K (j - P,
// strided: 3-D and 4-D inputs share the code through element strides).  DMAX >= max(D, Dv)
// is a compile-time bound (64, 128, 256); D and Dv are runtime values, padded with zeros.
//
// Split-KV (gridDim.y = splits > 1): the key tiles of a block are divided among the splits;
// each writes its unnormalised output rows and (max, sum) to `part` (float32):
//   part[row * Dv + dv], row = (split * BH + bh) * M + rho;  part[R * Dv + 2 * row + {0, 1}]
// with R = splits * BH * M rows, and gk_attn_combine produces Y.
#include "common/gk_common.cuh"
#include "common/mma.cuh"

namespace gk_attn {

using gk::i64;

__device__ __forceinline__ float neg_inf() { return __int_as_float((int)0xff800000u); }

// The scalar parameters shared by the two forward kernels (see the launcher for meanings).
#define GK_ATTN_SCALARS                                                                           \
  int Hq, int Hkv, int Sq, int Skv, int P, int D, int Dv, gk::i64 sQb, gk::i64 sQh, gk::i64 sQs,    \
      gk::i64 sKb, gk::i64 sKh, gk::i64 sKs, gk::i64 sVb, gk::i64 sVh, gk::i64 sVs, gk::i64 sYb,     \
      gk::i64 sYh, gk::i64 sYs, int mask_kind, int Lm, gk::i64 sMb, gk::i64 sMh, gk::i64 sMq,        \
      gk::i64 sMk, int causal, int left, int right, float scale, float softcap, float inv_softcap, \
      int row_blocks, int BH, int vec_ok

struct Args {
  int Hq, Hkv, G, Sq, Skv, P, T, D, Dv, M;
  i64 sQb, sQh, sQs, sKb, sKh, sKs, sVb, sVh, sVs, sYb, sYh, sYs;
  int mask_kind, Lm;
  i64 sMb, sMh, sMq, sMk;
  int causal, left, right;
  float scale, softcap, inv_softcap;
  int row_blocks, BH, vec_ok;
  const void* mask;
  // this block
  int b, hk, bh, rb, split, splits, kvlen, off;
};

#define GK_ATTN_MAKE_ARGS(a)                                                                          \
  Args a;                                                                                              \
  a.Hq = Hq; a.Hkv = Hkv; a.G = Hq / Hkv; a.Sq = Sq; a.Skv = Skv; a.P = P; a.T = P + Skv; a.D = D;     \
  a.Dv = Dv; a.M = a.G * Sq;                                                                           \
  a.sQb = sQb; a.sQh = sQh; a.sQs = sQs; a.sKb = sKb; a.sKh = sKh; a.sKs = sKs;                        \
  a.sVb = sVb; a.sVh = sVh; a.sVs = sVs; a.sYb = sYb; a.sYh = sYh; a.sYs = sYs;                        \
  a.mask_kind = mask_kind; a.Lm = Lm; a.sMb = sMb; a.sMh = sMh; a.sMq = sMq; a.sMk = sMk;              \
  a.causal = causal; a.left = left; a.right = right; a.scale = scale; a.softcap = softcap;             \
  a.inv_softcap = inv_softcap; a.row_blocks = row_blocks; a.BH = BH; a.vec_ok = vec_ok; a.mask = mask; \
  block_setup(a, nonpad)

__device__ __forceinline__ void block_setup(Args& a, const long long* nonpad) {
  int bid = blockIdx.x;
  // heavy (late, causal) row blocks first
  a.rb = a.row_blocks - 1 - bid % a.row_blocks;
  a.bh = bid / a.row_blocks;
  a.b = a.bh / a.Hkv;
  a.hk = a.bh % a.Hkv;
  a.split = blockIdx.y;
  a.splits = gridDim.y;
  if (nonpad != nullptr) {
    long long n = nonpad[a.b];
    n = n < 0 ? 0 : (n > a.T ? a.T : n);  // the host validated; stay in bounds anyway
    a.kvlen = (int)n;
    a.off = (int)n - a.Sq;
  } else {
    a.kvlen = a.T;
    a.off = a.P;
  }
}

// One query row's visible key range [lo, hi) and its mask row offset.
struct Row {
  int lo, hi;
  i64 moff;
};

__device__ __forceinline__ Row make_row(const Args& a, int rho) {
  Row r;
  if (rho >= a.M) {  // padding row of the last block: no keys, never stored
    r.lo = 0;
    r.hi = 0;
    r.moff = 0;
    return r;
  }
  int i = rho / a.G;
  int h = a.hk * a.G + rho % a.G;
  i64 pos = (i64)i + a.off;  // absolute position of the query
  i64 lo = 0, hi = a.kvlen;
  if (a.causal && pos + 1 < hi) hi = pos + 1;
  if (a.right >= 0 && pos + a.right + 1 < hi) hi = pos + a.right + 1;
  if (a.left >= 0 && pos - a.left > lo) lo = pos - a.left;
  if (hi < 0) hi = 0;
  if (lo > hi) lo = hi;
  r.lo = (int)lo;
  r.hi = (int)hi;
  r.moff = (i64)a.b * a.sMb + (i64)h * a.sMh + (i64)i * a.sMq;
  return r;
}

__device__ __forceinline__ float mask_value(const Args& a, i64 off) {
  switch (a.mask_kind) {
    case 1:
      return static_cast<const unsigned char*>(a.mask)[off] ? 0.0f : neg_inf();
    case 2:
      return static_cast<const float*>(a.mask)[off];
    case 3:
      return gk::to_float(static_cast<const __half*>(a.mask)[off]);
    default:
      return gk::to_float(static_cast<const __nv_bfloat16*>(a.mask)[off]);
  }
}

// Score of (row, key j) from the raw (scaled) dot product: softcap, then the bias.
__device__ __forceinline__ float finish_score(const Args& a, float x, const Row& r, int j, bool need_bias) {
  if (a.softcap > 0.0f) x = tanhf(x * a.inv_softcap) * a.softcap;
  if (need_bias) {
    if (j < r.lo || j >= r.hi) return neg_inf();
    if (a.mask_kind != 0) {
      if (j >= a.Lm) return neg_inf();
      x += mask_value(a, r.moff + (i64)j * a.sMk);
    }
  }
  return x;
}

// The key tiles [t_begin, t_end) of this block and split, and whether a tile needs the
// per-element bias.
struct TileRange {
  int t_begin, t_end;
  int lo_max, hi_min;  // every row of the block sees at least the keys [lo_max, hi_min)
};

template <int BM, int BN>
__device__ __forceinline__ TileRange tile_range(const Args& a) {
  TileRange tr;
  int rho0 = a.rb * BM;
  int rho1 = min(rho0 + BM, a.M) - 1;
  Row first = make_row(a, (rho0 / a.G) * a.G);
  Row last = make_row(a, (rho1 / a.G) * a.G);
  int klo = first.lo, khi = last.hi;  // lo and hi grow with the query position
  tr.lo_max = last.lo;
  tr.hi_min = first.hi;
  int tb = 0, te = 0;
  if (khi > klo) {
    tb = klo / BN;
    te = (khi + BN - 1) / BN;
  }
  int n = te - tb;
  int chunk = (n + a.splits - 1) / a.splits;
  tr.t_begin = tb + a.split * chunk;
  tr.t_end = min(te, tr.t_begin + chunk);
  return tr;
}

template <int BN>
__device__ __forceinline__ bool tile_needs_bias(const Args& a, const TileRange& tr, int j0) {
  return a.mask_kind != 0 || j0 < tr.lo_max || j0 + BN > tr.hi_min;
}

// Address of key/value row j of (b, hk).
template <class T>
__device__ __forceinline__ const T* kv_row(const T* cur, const T* past, const Args& a, int j, int width, i64 sb,
                                           i64 sh, i64 ss) {
  if (j < a.P) return past + ((i64)a.bh * a.P + j) * width;
  return cur + (i64)a.b * sb + (i64)a.hk * sh + (i64)(j - a.P) * ss;
}

__device__ __forceinline__ const float* q_row_f(const float* q, const Args& a, int rho) {
  int i = rho / a.G, h = a.hk * a.G + rho % a.G;
  return q + (i64)a.b * a.sQb + (i64)h * a.sQh + (i64)i * a.sQs;
}

template <class T>
__device__ __forceinline__ T* y_row(T* y, const Args& a, int rho) {
  int i = rho / a.G, h = a.hk * a.G + rho % a.G;
  return y + (i64)a.b * a.sYb + (i64)h * a.sYh + (i64)i * a.sYs;
}

// Online softmax update of one row: x[] are this thread's scores of the row (masked ones
// -inf), reduced over `width` lanes (xor butterflies below width).  Returns alpha, the factor
// that rescales the previous accumulator; x[] become the probabilities.
template <int N, bool FAST_EXP>
__device__ __forceinline__ float online_softmax(float (&x)[N], float& m, float& l, int width) {
  float mx = neg_inf();
#pragma unroll
  for (int j = 0; j < N; ++j) mx = fmaxf(mx, x[j]);
  for (int o = width >> 1; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float mnew = fmaxf(m, mx);
  float ms = mnew == neg_inf() ? 0.0f : mnew;
  float alpha = FAST_EXP ? __expf(m - ms) : expf(m - ms);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float p = FAST_EXP ? __expf(x[j] - ms) : expf(x[j] - ms);
    x[j] = p;
    sum += p;
  }
  for (int o = width >> 1; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  l = l * alpha + sum;
  m = mnew;
  return alpha;
}

// N floats to shared memory at p (one float4 / float2 store when N is 4 / 2; p aligned).
template <int N>
__device__ __forceinline__ void sts(float* p, const float* in) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(in[0], in[1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = in[i];
  }
}

// ------------------------------------------------------------------ tensor-core helpers
template <class T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) { return gk::pack_half2(lo, hi); }
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  return gk::pack_bf162(lo, hi);
}
// P for the P V product: float16 keeps the probabilities as hi + lo (two float16 parts, about
// 22 significant bits) so that O is within float32 rounding of the exact P V, as the array
// path computes it (one float16 rounding of P alone puts outputs 2 ulps off the official
// cases' float32-computed expectations).  bfloat16 rounds P once (its 8-bit output ulp is
// far above that error), as flash-attention kernels do.
template <class T> struct SplitP { static constexpr bool value = false; };
template <> struct SplitP<__half> { static constexpr bool value = true; };
template <class T>
__device__ __forceinline__ void pack_p(float p0, float p1, unsigned& hi, unsigned& lo) {
  if (SplitP<T>::value) {
    const float h0 = gk::to_float(gk::from_float<T>(p0)), h1 = gk::to_float(gk::from_float<T>(p1));
    hi = pack2<T>(h0, h1);
    lo = pack2<T>(p0 - h0, p1 - h1);
  } else {
    hi = pack2<T>(p0, p1);
    lo = 0u;
  }
}
// The A fragment of P for k-step kk of the P V product, from the S accumulators (n8 tiles of
// keys, columns in TensorCore<T>::acc_col order).  f16 / bf16: keys 16 kk .. +16 are the n8
// tiles 2 kk and 2 kk + 1, packed in pairs (pack_p).  float (TF32): keys 8 kk .. +8 are tile
// kk, whose accumulators already sit in the A layout (columns t, t + 4); P is rounded to TF32
// once, as the tensor core rounds every input.
template <class T, int NB>
__device__ __forceinline__ void p_fragment(const float (&s)[NB][4], int kk, unsigned (&hi)[4], unsigned (&lo)[4]) {
  if constexpr (sizeof(T) == 4) {
    hi[0] = gk::to_tf32(s[kk][0]);
    hi[1] = gk::to_tf32(s[kk][2]);
    hi[2] = gk::to_tf32(s[kk][1]);
    hi[3] = gk::to_tf32(s[kk][3]);
  } else {
    pack_p<T>(s[2 * kk][0], s[2 * kk][1], hi[0], lo[0]);
    pack_p<T>(s[2 * kk][2], s[2 * kk][3], hi[1], lo[1]);
    pack_p<T>(s[2 * kk + 1][0], s[2 * kk + 1][1], hi[2], lo[2]);
    pack_p<T>(s[2 * kk + 1][2], s[2 * kk + 1][3], hi[3], lo[3]);
  }
}

// Tile shape of gk_attn_tc<T, DMAX, NW> (the launcher mirrors it: gpu/attention.py tc_tile):
// BN keys per tile and the leading dimensions (elements) of Q / K rows and of V rows.
// f16 / bf16: BN 64 (32 for DMAX 256), LD = DMAX + 8 (an odd multiple of 16 bytes: ldmatrix
// conflict-free).  float: BN = 4096 / DMAX (64, 32, 16) so that the double-buffered tiles fit
// the 163 KB an sm_80 block may use; LDK = DMAX + 4 (4 mod 8 words: the TF32 A and [n][k] B
// loads are conflict-free), LDV = DMAX + 8 (8 mod 16: the [k][n] B loads).
template <class T, int DMAX>
struct TcTile {
  static constexpr bool F32 = sizeof(T) == 4;
  static constexpr int BN = F32 ? 4096 / DMAX : (DMAX == 256 ? 32 : 64);
  static constexpr int LDK = DMAX + (F32 ? 4 : 8), LDV = DMAX + 8;
};

}  // namespace gk_attn

// ====================================================================== float32 (SIMT)
// 256 threads = 16 (ty) x 16 (tx).  Thread (ty, tx) owns rows ty*TM .. +TM of the block,
// score columns tx*TN .. +TN of a key tile, and output columns qd*64 + tx*4 .. +4.
// Shared memory: Qs [DMAX][BM+4] (Q^T, pre-scaled), Ks [DMAX][BN+4] (K^T; reused for P
// [BM][BN+4] after the scores are in registers), Vs [BN][DMAX+4].
// Bank conflicts (scripts/emu_perf_report.py counts them): the transposing stores give each
// warp 4 rows x 8 columns of Q (Q^T rows are BM+4 = 4 mod 8 words apart: 8 q-columns x 4 rows
// cover 32 banks) and 16 keys x 2 float4 chunks of K and V (K^T rows d and d+4 are 16 banks
// apart); global loads stay whole 32-byte sectors.  P is stored row-major with float4 stores
// (a quarter warp writes 32 consecutive words) and read back as float4 along the keys
// (broadcast: a quarter warp shares ty); every inner-loop load is conflict-free.
template <int DMAX, int BM>
__global__ void __launch_bounds__(256, DMAX <= 128 ? 2 : 1) gk_attn_simt(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ pk, const float* __restrict__ pv, const void* __restrict__ mask,
    const long long* __restrict__ nonpad, float* __restrict__ y, float* __restrict__ part, GK_ATTN_SCALARS) {
  using namespace gk_attn;
  constexpr int BN = DMAX == 256 ? 32 : 64;
  constexpr int TM = BM / 16, TN = BN / 16, NQ = DMAX / 64;
  constexpr int QLD = BM + 4, KLD = BN + 4, VLD = DMAX + 4, PLD = BN + 4;
  static_assert(BM * PLD <= DMAX * KLD, "P tile must fit the K tile");
  static_assert(BM % 4 == 0 && DMAX % 8 == 0 && BN % 16 == 0, "tile shapes of the load mappings");
  GK_ATTN_MAKE_ARGS(a);
  extern __shared__ __align__(16) unsigned char gk_attn_smem[];
  float* Qs = reinterpret_cast<float*>(gk_attn_smem);
  float* Ks = Qs + DMAX * QLD;
  float* Ps = Ks;
  float* Vs = Ks + DMAX * KLD;
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int rho0 = a.rb * BM;

  // Q^T: lane l of a group of 32 takes row (l >> 3) of 4 and column (l & 7) of 8
  for (int idx = tid; idx < BM * DMAX; idx += 256) {
    const int grp = idx >> 5, l = idx & 31;
    const int r = (grp % (BM / 4)) * 4 + (l >> 3), d = (grp / (BM / 4)) * 8 + (l & 7);
    int rho = rho0 + r;
    float val = 0.0f;
    if (rho < a.M && d < a.D) val = q_row_f(q, a, rho)[d] * a.scale;
    Qs[d * QLD + r] = val;
  }
  Row rows[TM];
  float m[TM], l[TM], o[TM][4 * NQ];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    rows[i] = make_row(a, rho0 + ty * TM + i);
    m[i] = neg_inf();
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4 * NQ; ++c) o[i][c] = 0.0f;
  }
  const TileRange tr = tile_range<BM, BN>(a);

  for (int t = tr.t_begin; t < tr.t_end; ++t) {
    const int j0 = t * BN;
    __syncthreads();  // the previous tile's P and V are consumed
    if (a.vec_ok) {   // 16-byte loads: D, Dv multiples of 4, aligned rows
      // lane l of a group of 32 takes key (l & 15) of 16 and float4 chunk (l >> 4) of 2
      for (int idx = tid; idx < BN * (DMAX / 4); idx += 256) {
        const int grp = idx >> 5, l = idx & 31;
        const int c = (grp % (BN / 16)) * 16 + (l & 15), d = ((grp / (BN / 16)) * 2 + (l >> 4)) * 4;
        int j = j0 + c;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
        if (j < a.T) {
          if (d < a.D) kv = *reinterpret_cast<const float4*>(kv_row(k, pk, a, j, a.D, a.sKb, a.sKh, a.sKs) + d);
          if (d < a.Dv) vv = *reinterpret_cast<const float4*>(kv_row(v, pv, a, j, a.Dv, a.sVb, a.sVh, a.sVs) + d);
        }
        Ks[d * KLD + c] = kv.x;
        Ks[(d + 1) * KLD + c] = kv.y;
        Ks[(d + 2) * KLD + c] = kv.z;
        Ks[(d + 3) * KLD + c] = kv.w;
        *reinterpret_cast<float4*>(Vs + c * VLD + d) = vv;
      }
    } else {
      for (int idx = tid; idx < BN * DMAX; idx += 256) {
        int c = idx / DMAX, d = idx % DMAX;
        int j = j0 + c;
        float kv = 0.0f, vv = 0.0f;
        if (j < a.T) {
          if (d < a.D) kv = kv_row(k, pk, a, j, a.D, a.sKb, a.sKh, a.sKs)[d];
          if (d < a.Dv) vv = kv_row(v, pv, a, j, a.Dv, a.sVb, a.sVh, a.sVs)[d];
        }
        Ks[d * KLD + c] = kv;
        Vs[c * VLD + d] = vv;
      }
    }
    __syncthreads();

    float s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < a.D; ++d) {
      float aq[TM], bk[TN];
      gk::lds<TM>(Qs + d * QLD + ty * TM, aq);
      gk::lds<TN>(Ks + d * KLD + tx * TN, bk);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) s[i][j] = fmaf(aq[i], bk[j], s[i][j]);
    }
    const bool need = tile_needs_bias<BN>(a, tr, j0);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = finish_score(a, s[i][j], rows[i], j0 + tx * TN + j, need);
      float alpha = online_softmax<TN, false>(s[i], m[i], l[i], 16);
#pragma unroll
      for (int c = 0; c < 4 * NQ; ++c) o[i][c] *= alpha;
    }
    __syncthreads();  // every thread is done reading Ks: reuse it for P
#pragma unroll
    for (int i = 0; i < TM; ++i) sts<TN>(Ps + (ty * TM + i) * PLD + tx * TN, s[i]);
    __syncthreads();
#pragma unroll 1
    for (int c0 = 0; c0 < BN; c0 += 4) {
      float ap[TM][4];
#pragma unroll
      for (int i = 0; i < TM; ++i) gk::lds<4>(Ps + (ty * TM + i) * PLD + c0, ap[i]);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc)
#pragma unroll
        for (int qd = 0; qd < NQ; ++qd) {
          float vv[4];
          gk::lds<4>(Vs + (c0 + cc) * VLD + qd * 64 + tx * 4, vv);
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[i][qd * 4 + e] = fmaf(ap[i][cc], vv[e], o[i][qd * 4 + e]);
        }
    }
  }

  const i64 R = (i64)a.splits * a.BH * a.M;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    int rho = rho0 + ty * TM + i;
    if (rho >= a.M) continue;
    if (a.splits == 1) {
      float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      float* yr = y_row(y, a, rho);
#pragma unroll
      for (int qd = 0; qd < NQ; ++qd)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int dv = qd * 64 + tx * 4 + e;
          if (dv < a.Dv) yr[dv] = o[i][qd * 4 + e] * inv;
        }
    } else {
      i64 row = ((i64)a.split * a.BH + a.bh) * a.M + rho;
#pragma unroll
      for (int qd = 0; qd < NQ; ++qd)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int dv = qd * 64 + tx * 4 + e;
          if (dv < a.Dv) part[row * a.Dv + dv] = o[i][qd * 4 + e];
        }
      if (tx == 0) {
        part[R * a.Dv + 2 * row] = m[i];
        part[R * a.Dv + 2 * row + 1] = l[i];
      }
    }
  }
}

// ====================================================================== tensor cores
// One 16-byte chunk (16 / sizeof(T) elements) of a row into shared memory: elements d.. of
// src (nullptr: a row past the end), zero past the row length n.  With vec_ok (16-byte
// aligned rows, lengths a multiple of the chunk) one cp.async that zero-fills when nothing is
// read (from base, a valid address); else element by element.
template <class T>
__device__ __forceinline__ void copy_chunk16(T* dst, const T* src, const T* base, int d, int n, bool vec_ok) {
  if (vec_ok) {
    const bool ok = src != nullptr && d < n;
    gk::cp_async_16(dst, ok ? src : base, ok ? 16 : 0);
  } else {
    const T zero = gk::from_float<T>(0.0f);
#pragma unroll
    for (int e = 0; e < (int)(16 / sizeof(T)); ++e) dst[e] = (src != nullptr && d + e < n) ? src[e] : zero;
  }
}

// NW warps; warp w owns rows w*16 .. +16 of the block (BM = 16 NW).  T = __half /
// __nv_bfloat16, or float for TF32; products through gk::TensorCore<T>.  Per key tile:
// S (16 x BN) = Q K^T (A = Q rows, B = K rows: load_b_nk), the online softmax on the
// accumulator fragments (a row spans the 4 lanes of a quad; key of an accumulator by
// acc_col), then O += P V with P taken straight from the S fragments (p_fragment: rounded
// to T, float16 as hi + lo, see pack_p; TF32 rounded once) and V rows as a [k][n] B.
// K/V tiles are double-buffered (cp.async when 16-byte aligned).
// Shared memory: Qs [BM][LDK], Ks [2][BN][LDK], Vs [2][BN][LDV] (TcTile).
template <class T, int DMAX, int NW>
__global__ void __launch_bounds__(NW * 32, 1) gk_attn_tc(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ pk,
    const T* __restrict__ pv, const void* __restrict__ mask, const long long* __restrict__ nonpad,
    T* __restrict__ y, float* __restrict__ part, GK_ATTN_SCALARS) {
  using namespace gk_attn;
  using TC = gk::TensorCore<T>;
  using Tile = TcTile<T, DMAX>;
  constexpr int BM = 16 * NW, BN = Tile::BN, LDK = Tile::LDK, LDV = Tile::LDV, NT = NW * 32, KS = TC::KS;
  constexpr int NB = BN / 8, NO = DMAX / 8, CH = 16 / sizeof(T);
  static_assert(BN % 16 == 0 && DMAX % 16 == 0, "key tiles and head sizes in pairs of n8 tiles");
  GK_ATTN_MAKE_ARGS(a);
  extern __shared__ __align__(16) unsigned char gk_attn_smem[];
  T* Qs = reinterpret_cast<T*>(gk_attn_smem);
  T* Ks = Qs + BM * LDK;
  T* Vs = Ks + 2 * BN * LDK;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int rho0 = a.rb * BM;
  const int dpad = (a.D + KS - 1) / KS * KS, dvpad = (a.Dv + 15) & ~15;
  const int dch = dpad / CH, dvch = dvpad / CH;  // 16-byte chunks per row

  // rows [rho0, rho0 + BM) of Q into Qs
  for (int idx = tid; idx < BM * dch; idx += NT) {
    int r = idx / dch, d = (idx % dch) * CH;
    int rho = rho0 + r;
    T* dst = Qs + r * LDK + d;
    const T* src = nullptr;
    if (rho < a.M) {
      int i = rho / a.G, h = a.hk * a.G + rho % a.G;
      src = q + (i64)a.b * a.sQb + (i64)h * a.sQh + (i64)i * a.sQs + d;
    }
    copy_chunk16(dst, src, q, d, a.D, a.vec_ok);
  }
  auto load_tile = [&](int t, int buf) {
    const int j0 = t * BN;
    T* kd = Ks + buf * BN * LDK;
    T* vd = Vs + buf * BN * LDV;
    for (int idx = tid; idx < BN * dch; idx += NT) {
      int c = idx / dch, d = (idx % dch) * CH, j = j0 + c;
      T* dst = kd + c * LDK + d;
      const T* src = j < a.T ? kv_row(k, pk, a, j, a.D, a.sKb, a.sKh, a.sKs) + d : nullptr;
      copy_chunk16(dst, src, k, d, a.D, a.vec_ok);
    }
    for (int idx = tid; idx < BN * dvch; idx += NT) {
      int c = idx / dvch, d = (idx % dvch) * CH, j = j0 + c;
      T* dst = vd + c * LDV + d;
      const T* src = j < a.T ? kv_row(v, pv, a, j, a.Dv, a.sVb, a.sVh, a.sVs) + d : nullptr;
      copy_chunk16(dst, src, v, d, a.Dv, a.vec_ok);
    }
  };

  Row rows[2];
  rows[0] = make_row(a, rho0 + warp * 16 + g);
  rows[1] = make_row(a, rho0 + warp * 16 + g + 8);
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  const TileRange tr = tile_range<BM, BN>(a);

  if (tr.t_begin < tr.t_end) load_tile(tr.t_begin, 0);
  gk::cp_async_commit();
  for (int t = tr.t_begin; t < tr.t_end; ++t) {
    const int buf = (t - tr.t_begin) & 1;
    const int j0 = t * BN;
    gk::cp_async_wait<0>();
    __syncthreads();  // tile t (and Q) landed; everyone is done with the other buffer
    if (t + 1 < tr.t_end) load_tile(t + 1, buf ^ 1);
    gk::cp_async_commit();

    const T* Kb = Ks + buf * BN * LDK;
    const T* Vb = Vs + buf * BN * LDV;
    float s[NB][4];
#pragma unroll
    for (int n = 0; n < NB; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DMAX / KS; ++kk) {
      if (kk * KS >= dpad) break;
      unsigned af[4];
      TC::load_a(af, Qs + warp * 16 * LDK + kk * KS, LDK, lane);
#pragma unroll
      for (int n2 = 0; n2 < NB / 2; ++n2) {
        unsigned b0[2], b1[2];
        TC::load_b_nk(b0, b1, Kb + n2 * 16 * LDK + kk * KS, LDK, lane);
        TC::mma(s[2 * n2], af, b0);
        TC::mma(s[2 * n2 + 1], af, b1);
      }
    }
    const bool need = tile_needs_bias<BN>(a, tr, j0);
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      float x[2 * NB];
#pragma unroll
      for (int n = 0; n < NB; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          x[2 * n + e] =
              finish_score(a, s[n][2 * ri + e] * a.scale, rows[ri], j0 + n * 8 + TC::acc_col(t4, e), need);
      float alpha = online_softmax<2 * NB, true>(x, m[ri], l[ri], 4);
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        s[n][2 * ri] = x[2 * n];
        s[n][2 * ri + 1] = x[2 * n + 1];
      }
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * ri] *= alpha;
        o[n][2 * ri + 1] *= alpha;
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / KS; ++kk) {
      unsigned af[4], al[4];
      p_fragment<T>(s, kk, af, al);
#pragma unroll
      for (int n2 = 0; n2 < NO / 2; ++n2) {
        if (n2 * 16 >= dvpad) break;
        unsigned b0[2], b1[2];
        TC::load_b_kn(b0, b1, Vb + kk * KS * LDV + n2 * 16, LDV, lane);
        TC::mma(o[2 * n2], af, b0);
        TC::mma(o[2 * n2 + 1], af, b1);
        if constexpr (SplitP<T>::value) {
          TC::mma(o[2 * n2], al, b0);
          TC::mma(o[2 * n2 + 1], al, b1);
        }
      }
    }
  }
  gk::cp_async_wait<0>();

  const i64 R = (i64)a.splits * a.BH * a.M;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    int rho = rho0 + warp * 16 + g + 8 * ri;
    if (rho >= a.M) continue;
    if (a.splits == 1) {
      float inv = l[ri] > 0.0f ? 1.0f / l[ri] : 0.0f;
      T* yr = y_row(y, a, rho);
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          int dv = n * 8 + 2 * t4 + e;
          if (dv < a.Dv) yr[dv] = gk::from_float<T>(o[n][2 * ri + e] * inv);
        }
    } else {
      i64 row = ((i64)a.split * a.BH + a.bh) * a.M + rho;
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          int dv = n * 8 + 2 * t4 + e;
          if (dv < a.Dv) part[row * a.Dv + dv] = o[n][2 * ri + e];
        }
      if (t4 == 0) {
        part[R * a.Dv + 2 * row] = m[ri];
        part[R * a.Dv + 2 * row + 1] = l[ri];
      }
    }
  }
}

// ====================================================================== split-KV combine
// One block per output row (bh * M + rho); threads over dv.
template <class T>
__global__ void __launch_bounds__(128) gk_attn_combine(const float* __restrict__ part, T* __restrict__ y, int splits,
                                                       int BH, int M, int Hkv, int G, int Dv, gk::i64 sYb,
                                                       gk::i64 sYh, gk::i64 sYs) {
  using gk::i64;
  const i64 row0 = blockIdx.x;
  const int bh = (int)(row0 / M), rho = (int)(row0 % M);
  const int b = bh / Hkv, hk = bh % Hkv, i = rho / G, h = hk * G + rho % G;
  const i64 R = (i64)splits * BH * M;
  const float* ml = part + R * Dv;
  float mg = gk_attn::neg_inf();
  for (int s = 0; s < splits; ++s) mg = fmaxf(mg, ml[2 * (((i64)s * BH + bh) * M + rho)]);
  T* yr = y + (i64)b * sYb + (i64)h * sYh + (i64)i * sYs;
  for (int dv = threadIdx.x; dv < Dv; dv += blockDim.x) {
    float lsum = 0.0f, acc = 0.0f;
    if (mg != gk_attn::neg_inf()) {
      for (int s = 0; s < splits; ++s) {
        i64 r = ((i64)s * BH + bh) * M + rho;
        float w = expf(ml[2 * r] - mg);
        lsum += ml[2 * r + 1] * w;
        acc += part[r * Dv + dv] * w;
      }
    }
    yr[dv] = gk::from_float<T>(lsum > 0.0f ? acc / lsum : 0.0f);
  }
}

// ====================================================================== present key/value
// out (B, Hkv, P + S, D) = concat(past (B, Hkv, P, D), cur (strided (B, Hkv, S, D))), as bits.
template <class U>
__global__ void __launch_bounds__(256) gk_attn_present(const U* __restrict__ past, const U* __restrict__ cur,
                                                       U* __restrict__ out, int Hkv, int P, int S, int D,
                                                       gk::i64 sb, gk::i64 sh, gk::i64 ss, gk::i64 total) {
  using gk::i64;
  const int T = P + S;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
    int d = (int)(idx % D);
    i64 rest = idx / D;
    int j = (int)(rest % T);
    i64 bh = rest / T;
    if (j < P) {
      out[idx] = past[(bh * P + j) * D + d];
    } else {
      i64 b = bh / Hkv, h = bh % Hkv;
      out[idx] = cur[b * sb + h * sh + (i64)(j - P) * ss + d];
    }
  }
}
