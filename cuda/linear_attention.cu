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
