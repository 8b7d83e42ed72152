// linear_attention.cu -- ONNX LinearAttention (opset 27): the four update rules
//   linear       S = S + k u^T,                       u = v
//   gated        S = diag(a) S + k u^T,               u = v,                 a = exp(decay_t)
//   delta        S = S + k u^T,                       u = beta (v - S^T k)
//   gated_delta  S = diag(a) S + k u^T,               u = beta (v - (diag(a) S)^T k)
// with o_t = scale * q_t^T S_t for the q_num_heads / kv_num_heads query heads of a KV head
// (GQA), optional past state, decay per head (B, T, Hkv) or per key dimension
// (B, T, Hkv * dk), beta per head (B, T, Hkv) or shared (B, T, 1).
//
// The state is float32 here (the host converts a half-typed past_state / present_state).
// Runtime flags select the rule: decay_width (0 none, 1 per head, dk per key dimension)
// and beta_heads (0 none, 1 shared, Hkv per head).
//
// gk_la_recurrent: one step per token, the state on chip.  Column j of S evolves on its
//   own (S[:, j] = a * S[:, j]; u_j = beta (v_j - k . S[:, j]); S[:, j] += k u_j), so blocks
//   split d_v: a warp holds 8 columns x d_k rows, 4 lanes per column with R rows each
//   (rows kt, kt + 4, ...; d_k <= 4R), reductions over d_k are two xor-shuffles.  Used
//   for decoding and short sequences, and correct for any length.
//
// gk_la_chunk_prep + gk_la_chunk_state: the chunked form for long sequences (C = 32 tokens
//   per chunk).  prep (parallel over (chunk, head, batch)) computes the chunk-local parts:
//   cumulative log decay Gam_t = sum_{s<=t} g_s, the masked decayed products
//   M_j[t][s] = sum_d q_jt[d] k_s[d] exp(Gam_t[d] - Gam_s[d]) (s <= t) per query head, and
//   for the delta rules the UT transform: A[t][s] = beta_t sum_d k_t k_s exp(Gam_t - Gam_s)
//   (s < t) and the forward substitution (I + A) [U0 | W] = [beta V | beta K exp(Gam)].
//   state (parallel over (d_v tile, head, batch), sequential over chunks) carries S:
//   U = U0 - W S (delta) or V; O_j = scale ((Q_j exp(Gam)) S + M_j U);
//   S = diag(exp(Gam_C)) S + (K exp(Gam_C - Gam))^T U.
#include "common/gk_common.cuh"

namespace gk_la {

constexpr int KT = 4;  // lanes per state column along d_k (recurrent kernel)
constexpr int C = 32;  // chunk length (chunked kernels)

}  // namespace gk_la

// (no __launch_bounds__: with it ptxas 12.9 spills the R = 2 variant on sm_90; blocks have <= 128 threads)
template <class T, int R>
__global__ void gk_la_recurrent(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                const float* __restrict__ state_in, const T* __restrict__ decay, const T* __restrict__ beta,
                T* __restrict__ out, float* __restrict__ state_out, int T_, int Hq, int Hkv, int dk, int dv,
                int decay_width, int beta_heads, float scale) {
  using gk::i64;
  const int lane = threadIdx.x;  // blockDim.x == 32
  const int kt = lane >> 3, c = lane & 7;
  const int col = (blockIdx.x * blockDim.y + threadIdx.y) * 8 + c;
  const int h = blockIdx.y;
  const i64 b = blockIdx.z;
  const bool active = col < dv;
  const int G = Hq / Hkv;

  float s[R];
  const i64 sbase = (b * Hkv + h) * (i64)dk * dv;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int row = kt + gk_la::KT * i;
    s[i] = (state_in != nullptr && active && row < dk) ? state_in[sbase + (i64)row * dv + col] : 0.0f;
  }
  for (int t = 0; t < T_; ++t) {
    const i64 tok = b * T_ + t;
    const i64 kvh = tok * Hkv + h;
    if (decay_width == 1) {
      const float a = expf(gk::to_float(decay[kvh]));
#pragma unroll
      for (int i = 0; i < R; ++i) s[i] *= a;
    } else if (decay_width > 1) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int row = kt + gk_la::KT * i;
        if (row < dk) s[i] *= expf(gk::to_float(decay[kvh * dk + row]));
      }
    }
    float kr[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = kt + gk_la::KT * i;
      kr[i] = row < dk ? gk::to_float(k[kvh * dk + row]) : 0.0f;
    }
    float u = active ? gk::to_float(v[kvh * dv + col]) : 0.0f;
    if (beta_heads > 0) {
      float r = 0.0f;
#pragma unroll
      for (int i = 0; i < R; ++i) r += kr[i] * s[i];
      r += __shfl_xor_sync(0xffffffffu, r, 8);
      r += __shfl_xor_sync(0xffffffffu, r, 16);
      const float bt = gk::to_float(beta[tok * beta_heads + (beta_heads == 1 ? 0 : h)]);
      u = bt * (u - r);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] += kr[i] * u;
    for (int j = 0; j < G; ++j) {
      const i64 qh = tok * Hq + (i64)h * G + j;
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int row = kt + gk_la::KT * i;
        if (row < dk) o += gk::to_float(q[qh * dk + row]) * s[i];
      }
      o += __shfl_xor_sync(0xffffffffu, o, 8);
      o += __shfl_xor_sync(0xffffffffu, o, 16);
      if (kt == 0 && active) out[qh * dv + col] = gk::from_float<T>(o * scale);
    }
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = kt + gk_la::KT * i;
      if (row < dk) state_out[sbase + (i64)row * dv + col] = s[i];
    }
  }
}

// ---------------------------------------------------------------------- chunked form
// Chunk-local parts of chunks [c0, c0 + gridDim.x) (one block per (chunk, kv head, batch)).
// Workspace per (b, h, local chunk) w = (b * Hkv + h) * nch + blockIdx.x:
//   gam[w][C][dg]   cumulative log decay inside the chunk (dg = decay_width)
//   wm[w][C][dk]    W = (I + A)^-1 beta K exp(Gam)          (delta rules)
//   u0[w][C][dv]    U0 = (I + A)^-1 beta V                   (delta rules)
//   mqk[w][G][C][C] M_j[t][s] = q_jt . k_s exp(Gam_t - Gam_s) for s <= t, 0 above
// Dynamic shared memory: (2 C dk + C dg + C C + C + C blockDim.x) floats, an upper bound of
// what the layout below uses: the rows of Ks and Gs are padded to an odd length (lk = dk | 1,
// lg = dg | 1 when dg > 1) so that the 32 lanes of a warp reading column d of 32 different
// rows (A and M: lane = key s or j) hit 32 different banks -- with dk a multiple of 32 they
// would all hit one; the padding (at most 2 C floats) fits in the row of X that is never
// stored (X keeps C - 1 rows: row C - 1 is read by no later row), as long as blockDim.x >= 2 C.
template <class T>
__global__ void __launch_bounds__(256)
gk_la_chunk_prep(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 const T* __restrict__ decay, const T* __restrict__ beta, float* __restrict__ gam,
                 float* __restrict__ wm, float* __restrict__ u0, float* __restrict__ mqk, int c0, int nch, int T_,
                 int Hq, int Hkv, int dk, int dv, int decay_width, int beta_heads) {
  using gk::i64;
  using gk_la::C;
  extern __shared__ float smem[];
  const int dg = decay_width;
  const int lk = dk | 1, lg = dg > 1 ? (dg | 1) : dg;  // padded row lengths (odd)
  float* Ks = smem;            // C x lk
  float* Qs = Ks + C * lk;     // C x dk (read by rows: a warp reads one row)
  float* Gs = Qs + C * dk;     // C x lg
  float* A = Gs + C * lg;      // C x C
  float* bs = A + C * C;       // C
  const int tid = threadIdx.x, nt = blockDim.x;
  const int h = blockIdx.y;
  const i64 b = blockIdx.z;
  const int G = Hq / Hkv;
  const int tbase = (c0 + blockIdx.x) * C;
  const i64 w = (b * Hkv + h) * nch + blockIdx.x;

  for (int e = tid; e < C * dk; e += nt) {
    const int i = e / dk, d = e - i * dk, t = tbase + i;
    Ks[i * lk + d] = t < T_ ? gk::to_float(k[((b * T_ + t) * Hkv + h) * dk + d]) : 0.0f;
  }
  if (dg > 0) {
    for (int d = tid; d < dg; d += nt) {
      float acc = 0.0f;
      for (int i = 0; i < C; ++i) {
        const int t = tbase + i;
        if (t < T_) acc += gk::to_float(decay[((b * T_ + t) * Hkv + h) * dg + d]);
        Gs[i * lg + d] = acc;
        gam[(w * C + i) * dg + d] = acc;
      }
    }
  }
  if (beta_heads > 0) {
    for (int i = tid; i < C; i += nt) {
      const int t = tbase + i;
      bs[i] = t < T_ ? gk::to_float(beta[(b * T_ + t) * beta_heads + (beta_heads == 1 ? 0 : h)]) : 0.0f;
    }
  }
  __syncthreads();

  if (beta_heads > 0) {
    // A[i][j] = beta_i sum_d K_i K_j exp(Gam_i - Gam_j), strictly lower
    for (int e = tid; e < C * C; e += nt) {
      const int i = e / C, j = e - i * C;
      float acc = 0.0f;
      if (j < i) {
        if (dg > 1) {
          for (int d = 0; d < dk; ++d) acc += Ks[i * lk + d] * Ks[j * lk + d] * expf(Gs[i * lg + d] - Gs[j * lg + d]);
        } else {
          for (int d = 0; d < dk; ++d) acc += Ks[i * lk + d] * Ks[j * lk + d];
          if (dg == 1) acc *= expf(Gs[i] - Gs[j]);
        }
        acc *= bs[i];
      }
      A[e] = acc;
    }
    __syncthreads();
    // forward substitution, one column of [beta V | beta K exp(Gam)] per thread; the
    // column's solution so far lives in shared memory (X, (C - 1) x blockDim.x)
    float* X = bs + C;
    for (int col0 = 0; col0 < dv + dk; col0 += nt) {
      const int col = col0 + tid;
      if (col < dv + dk) {
#pragma unroll 1
        for (int i = 0; i < C; ++i) {
          const int t = tbase + i;
          float r;
          if (col < dv) {
            r = t < T_ ? gk::to_float(v[((b * T_ + t) * Hkv + h) * dv + col]) : 0.0f;
          } else {
            const int d = col - dv;
            r = Ks[i * lk + d];
            if (dg == 1) r *= expf(Gs[i]);
            else if (dg > 1) r *= expf(Gs[i * lg + d]);
          }
          r *= bs[i];
          for (int j = 0; j < i; ++j) r -= A[i * C + j] * X[j * nt + tid];
          if (i + 1 < C) X[i * nt + tid] = r;
          if (col < dv) u0[(w * C + i) * dv + col] = r;
          else wm[(w * C + i) * dk + (col - dv)] = r;
        }
      }
    }
  }

  // M_j for each query head of the group
  for (int j = 0; j < G; ++j) {
    __syncthreads();  // Qs is reused
    for (int e = tid; e < C * dk; e += nt) {
      const int i = e / dk, d = e - i * dk, t = tbase + i;
      Qs[e] = t < T_ ? gk::to_float(q[((b * T_ + t) * Hq + (i64)h * G + j) * dk + d]) : 0.0f;
    }
    __syncthreads();
    float* M = mqk + (w * G + j) * C * C;
    for (int e = tid; e < C * C; e += nt) {
      const int i = e / C, s = e - i * C;
      float acc = 0.0f;
      if (s <= i) {
        if (dg > 1) {
          for (int d = 0; d < dk; ++d) acc += Qs[i * dk + d] * Ks[s * lk + d] * expf(Gs[i * lg + d] - Gs[s * lg + d]);
        } else {
          for (int d = 0; d < dk; ++d) acc += Qs[i * dk + d] * Ks[s * lk + d];
          if (dg == 1) acc *= expf(Gs[i] - Gs[s]);
        }
      }
      M[e] = acc;
    }
  }
}

// The pass over chunks [c0, c0 + nch): one block per (d_v tile of 32 columns, kv head, batch)
// keeps its state tile S (dk x 32) in shared memory.  state_in may alias state_out (each
// block reads and writes only its own tile) or be null (zeros).
// Dynamic shared memory: (dk * 32 + 2 C dk + C dg + C dk + C * 32) floats.
template <class T>
__global__ void __launch_bounds__(256)
gk_la_chunk_state(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const float* gam, const float* wm, const float* u0, const float* mqk,
                  const float* state_in, T* __restrict__ out, float* state_out, int c0, int nch, int T_, int Hq,
                  int Hkv, int dk, int dv, int decay_width, int delta, float scale) {
  using gk::i64;
  using gk_la::C;
  constexpr int NT = 32;  // state columns per block
  extern __shared__ float smem[];
  const int dg = decay_width;
  float* S = smem;               // dk x NT
  float* Kd = S + dk * NT;       // C x dk: K_i exp(Gam_C - Gam_i)
  float* Qs = Kd + C * dk;       // C x dk: Q_i exp(Gam_i)
  float* Gs = Qs + C * dk;       // C x dg
  float* Wm = Gs + C * dg;       // C x dk
  float* U = Wm + C * dk;        // C x NT
  const int tid = threadIdx.x, nt = blockDim.x;
  const int n = tid % NT, r0 = tid / NT, rstep = nt / NT;
  const int col = blockIdx.x * NT + n;
  const bool active = col < dv;
  const int h = blockIdx.y;
  const i64 b = blockIdx.z;
  const int G = Hq / Hkv;
  const i64 sbase = (b * Hkv + h) * (i64)dk * dv;

  for (int d = r0; d < dk; d += rstep)
    S[d * NT + n] = (state_in != nullptr && active) ? state_in[sbase + (i64)d * dv + col] : 0.0f;

  for (int c = 0; c < nch; ++c) {
    const int tbase = (c0 + c) * C;
    const i64 w = (b * Hkv + h) * nch + c;
    __syncthreads();
    if (dg > 0)
      for (int e = tid; e < C * dg; e += nt) Gs[e] = gam[w * C * dg + e];
    __syncthreads();
    for (int e = tid; e < C * dk; e += nt) {
      const int i = e / dk, d = e - i * dk, t = tbase + i;
      float kv = t < T_ ? gk::to_float(k[((b * T_ + t) * Hkv + h) * dk + d]) : 0.0f;
      if (dg == 1) kv *= expf(Gs[C - 1] - Gs[i]);
      else if (dg > 1) kv *= expf(Gs[(C - 1) * dg + d] - Gs[i * dg + d]);
      Kd[e] = kv;
      if (delta) Wm[e] = wm[w * C * dk + e];
    }
    for (int i = r0; i < C; i += rstep) {
      const int t = tbase + i;
      float uv;
      if (delta) uv = active ? u0[(w * C + i) * dv + col] : 0.0f;
      else uv = (active && t < T_) ? gk::to_float(v[((b * T_ + t) * Hkv + h) * dv + col]) : 0.0f;
      U[i * NT + n] = uv;
    }
    __syncthreads();
    if (delta) {  // U = U0 - W S
      for (int i = r0; i < C; i += rstep) {
        float acc = U[i * NT + n];
        for (int d = 0; d < dk; ++d) acc -= Wm[i * dk + d] * S[d * NT + n];
        U[i * NT + n] = acc;
      }
      __syncthreads();
    }
    for (int j = 0; j < G; ++j) {
      for (int e = tid; e < C * dk; e += nt) {
        const int i = e / dk, d = e - i * dk, t = tbase + i;
        float qv = t < T_ ? gk::to_float(q[((b * T_ + t) * Hq + (i64)h * G + j) * dk + d]) : 0.0f;
        if (dg == 1) qv *= expf(Gs[i]);
        else if (dg > 1) qv *= expf(Gs[i * dg + d]);
        Qs[e] = qv;
      }
      __syncthreads();
      const float* M = mqk + (w * G + j) * C * C;
      for (int i = r0; i < C; i += rstep) {
        const int t = tbase + i;
        float acc = 0.0f;
        for (int d = 0; d < dk; ++d) acc += Qs[i * dk + d] * S[d * NT + n];
        for (int s = 0; s <= i; ++s) acc += M[i * C + s] * U[s * NT + n];
        if (active && t < T_) out[((b * T_ + t) * Hq + (i64)h * G + j) * dv + col] = gk::from_float<T>(acc * scale);
      }
      __syncthreads();
    }
    // S = diag(exp(Gam_C)) S + Kd^T U
    for (int d = r0; d < dk; d += rstep) {
      float acc = S[d * NT + n];
      if (dg == 1) acc *= expf(Gs[C - 1]);
      else if (dg > 1) acc *= expf(Gs[(C - 1) * dg + d]);
      for (int i = 0; i < C; ++i) acc += Kd[i * dk + d] * U[i * NT + n];
      S[d * NT + n] = acc;
    }
  }
  __syncthreads();
  if (active)
    for (int d = r0; d < dk; d += rstep) state_out[sbase + (i64)d * dv + col] = S[d * NT + n];
}
