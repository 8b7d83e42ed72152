// conv.cu -- ONNX Conv (NCHW, 1-D/2-D/3-D) as an implicit GEMM, and a direct kernel for
// depthwise convolutions.
//
// Per group g, Y[n, g*Mg + m, o] = sum_kk W[g*Mg + m, kk] * X_col[kk, (n, o)] (+ B[m]): a GEMM
// of Mg rows (output channels), Npix = N * prod(O) columns (output pixels) and
// Kg = Cg * KD * KH * KW reduction steps.  The im2col matrix X_col is never stored: each
// block gathers its (BK x BN) tile straight from X, using a small table built by the host,
// tab[kk] = (c, kd * dil_d, kh * dil_h, kw * dil_w), so that the reduction index needs no
// division in the kernel.  Spatial dims are always 3 (1-D and 2-D pad with size-1 dims).
//
//   gk_conv_simt<BM>     float32, exact float32 FMAs, tile BM x 128 x 8, 256 threads (8x8 or 4x8
//                        outputs per thread), register-prefetched double buffer
//   gk_conv_tc<T, BM, PW> tensor cores (gk::TensorCore<T>, common/mma.cuh), float32 accumulation,
//                        8 warps: __half / __nv_bfloat16 (m16n8k16, tile BM x 128 x 32) and, for
//                        float32 when the context allows TF32, float (TF32 m16n8k8, inputs
//                        rounded to nearest, tile BM x 128 x 16: the same bytes per tile);
//                        PW: 1x1 stride-1 unpadded convolutions read X 16 bytes at a time
//   gk_conv_direct<T>    depthwise (Cg == 1): one output element per thread, float32 sums
//
// Offsets into X and Y are 64-bit.  Out-of-range taps (padding) read as zero.
#include "common/gk_common.cuh"
#include "common/mma.cuh"

namespace gk_conv {

using gk::i64;

#define GK_CONV_SCALARS                                                                              \
  int C, int Din, int Hin, int Win, int M, int Mg, int Cg, int Kg, int Od, int Oh, int Ow, int sd, int sh, \
      int sw, int pd, int ph, int pw, gk::i64 npix, int mtiles

// Where one output pixel's receptive field starts.
struct Pixel {
  i64 xbase;  // offset of (n, first channel of the group) in X
  int id0, ih0, iw0;  // id0 is hugely negative for a pixel past the end: every tap misses
};

__device__ __forceinline__ Pixel make_pixel(i64 p, i64 npix, int g, int C, int Cg, i64 DHW, int Od, int Oh, int Ow,
                                            int sd, int sh, int sw, int pd, int ph, int pw) {
  Pixel px;
  const bool valid = p < npix;
  if (!valid) p = 0;
  i64 opix = (i64)Od * Oh * Ow;
  i64 n = p / opix;
  i64 r = p - n * opix;
  int ohw = Oh * Ow;
  int od = (int)(r / ohw);
  int r2 = (int)(r - (i64)od * ohw);
  int oh = r2 / Ow, ow = r2 - (r2 / Ow) * Ow;
  px.xbase = (n * C + (i64)g * Cg) * DHW;
  px.id0 = valid ? od * sd - pd : -(1 << 30);
  px.ih0 = oh * sh - ph;
  px.iw0 = ow * sw - pw;
  return px;
}

template <class T>
__device__ __forceinline__ T gather(const T* __restrict__ x, const int4* __restrict__ tab, const Pixel& px, int kg,
                                    int Kg, int Din, int Hin, int Win, i64 DHW) {
  if (kg >= Kg) return gk::from_float<T>(0.0f);
  int4 t = tab[kg];
  int id = px.id0 + t.y, ih = px.ih0 + t.z, iw = px.iw0 + t.w;
  if ((unsigned)id >= (unsigned)Din || (unsigned)ih >= (unsigned)Hin || (unsigned)iw >= (unsigned)Win)
    return gk::from_float<T>(0.0f);
  return x[px.xbase + (i64)t.x * DHW + ((i64)id * Hin + ih) * Win + iw];
}

// Y offset of output pixel p (without the channel term), or -1 past the end.
__device__ __forceinline__ i64 y_offset(i64 p, i64 npix, int M, i64 opix) {
  if (p >= npix) return -1;
  i64 n = p / opix;
  return n * M * opix + (p - n * opix);
}

}  // namespace gk_conv

// ====================================================================== float32 (SIMT)
// 256 threads = 16 (ty) x 16 (tx); thread (ty, tx) owns rows {ty*H + i, BM/2 + ty*H + i}
// (H = BM/32) and columns {tx*4 + j, 64 + tx*4 + j} of the BM x 128 tile.
template <int BM>
__global__ void __launch_bounds__(256, 2) gk_conv_simt(const float* __restrict__ x, const float* __restrict__ w,
                                                       const float* __restrict__ bias, const int4* __restrict__ tab,
                                                       float* __restrict__ y, GK_CONV_SCALARS) {
  using namespace gk_conv;
  constexpr int BN = 128, BK = 8, AH = BM / 32, ALD = BM + 4, BLD = BN + 4, NA = BM / 32;
  __shared__ __align__(16) float As[2][BK][ALD];
  __shared__ __align__(16) float Bs[2][BK][BLD];
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int g = blockIdx.y / mtiles, m0 = (blockIdx.y % mtiles) * BM;
  const i64 p0 = (i64)blockIdx.x * BN;
  const i64 DHW = (i64)Din * Hin * Win;
  const Pixel px = make_pixel(p0 + (tid & 127), npix, g, C, Cg, DHW, Od, Oh, Ow, sd, sh, sw, pd, ph, pw);
  const float* wg = w + (i64)g * Mg * Kg;

  float ra[NA], rb[4];
  auto load = [&](int k0) {
#pragma unroll
    for (int j = 0; j < NA; ++j) {
      int mr = m0 + (tid >> 3) + 32 * j, kg = k0 + (tid & 7);
      ra[j] = (mr < Mg && kg < Kg) ? wg[(i64)mr * Kg + kg] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) rb[j] = gather(x, tab, px, k0 + (tid >> 7) + 2 * j, Kg, Din, Hin, Win, DHW);
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int j = 0; j < NA; ++j) As[buf][tid & 7][(tid >> 3) + 32 * j] = ra[j];
#pragma unroll
    for (int j = 0; j < 4; ++j) Bs[buf][(tid >> 7) + 2 * j][tid & 127] = rb[j];
  };

  float acc[2 * AH][8];
#pragma unroll
  for (int i = 0; i < 2 * AH; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  const int nk = (Kg + BK - 1) / BK;
  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < nk) load((kt + 1) * BK);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[2 * AH], b[8];
      gk::lds<AH>(&As[buf][k][ty * AH], a);
      gk::lds<AH>(&As[buf][k][BM / 2 + ty * AH], a + AH);
      gk::lds<4>(&Bs[buf][k][tx * 4], b);
      gk::lds<4>(&Bs[buf][k][64 + tx * 4], b + 4);
#pragma unroll
      for (int i = 0; i < 2 * AH; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (kt + 1 < nk) store(buf ^ 1);
    __syncthreads();
  }

  const i64 opix = (i64)Od * Oh * Ow;
  i64 yo[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) yo[j] = y_offset(p0 + (j >> 2) * 64 + tx * 4 + (j & 3), npix, M, opix);
#pragma unroll
  for (int i = 0; i < 2 * AH; ++i) {
    int m = m0 + (i / AH) * (BM / 2) + ty * AH + (i % AH);
    if (m >= Mg) continue;
    int ch = g * Mg + m;
    float bv = bias != nullptr ? bias[ch] : 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (yo[j] >= 0) y[yo[j] + (i64)ch * opix] = acc[i][j] + bv;
  }
}

// ====================================================================== tensor cores
// 8 warps = 2 (rows) x 4 (columns); warp tile (BM/2) x 32 = MI m16 x 4 n8 fragments.
// T = __half / __nv_bfloat16 (m16n8k16) or float (TF32 m16n8k8, gk::TensorCore<float>).
// A (W rows, k contiguous) and B (X_col rows kk, pixels contiguous) fragments through
// TensorCore<T>; W is read in 16-byte chunks of CH elements (vector loads when vec_ok).
// BK = 64 bytes of k per tile (32 halves, 16 floats), so that both tile sets take the same
// shared memory; the leading dimensions keep every fragment load conflict-free (ALD: an odd
// multiple of 16 bytes, 4 mod 8 words; BLD: 8 mod 16 elements).
// PW (pointwise: 1x1 kernel, stride 1, no padding, output plane a multiple of CH elements,
// X 16-byte aligned): X_col rows are contiguous pixel runs of X, read CH pixels at a time.
template <class T, int BM, bool PW>
__global__ void __launch_bounds__(256, BM == 64 ? 2 : 1) gk_conv_tc(const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ bias, const int4* __restrict__ tab,
                                                  T* __restrict__ y, GK_CONV_SCALARS, int vec_ok) {
  using namespace gk_conv;
  using TC = gk::TensorCore<T>;
  constexpr int CH = 16 / sizeof(T);  // elements per 16-byte chunk
  constexpr int BN = 128, BK = 64 / sizeof(T), ALD = BK + CH, BLD = BN + 8, MI = BM / 32, NI = 4;
  constexpr int KCH = BK / CH, BCH = BN / CH;  // chunks per A row, per B row
  constexpr int NACH = BM * KCH / 256;        // A chunks per thread
  constexpr int NB = PW ? 1 : BK * BN / 256;  // B elements per thread (gather)
  constexpr int NBC = BK * BCH / 256;         // B chunks per thread (PW)
  static_assert(NACH >= 1 && NBC >= 1 && BK % TC::KS == 0, "tile shapes of the load mappings");
  __shared__ __align__(16) T As[2][BM][ALD];
  __shared__ __align__(16) T Bs[2][BK][BLD];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  const int g = blockIdx.y / mtiles, m0 = (blockIdx.y % mtiles) * BM;
  const i64 p0 = (i64)blockIdx.x * BN;
  const i64 DHW = (i64)Din * Hin * Win;
  const Pixel px = PW ? Pixel{} : make_pixel(p0 + (tid & 127), npix, g, C, Cg, DHW, Od, Oh, Ow, sd, sh, sw, pd,
                                             ph, pw);
  const T* wg = w + (i64)g * Mg * Kg;
  const T zero = gk::from_float<T>(0.0f);

  gk::Vec<T, CH> ra[NACH];
  T rb[NB];
  gk::Vec<T, CH> rbv[PW ? NBC : 1];
  i64 xoff[PW ? NBC : 1];  // PW: offset of the chunk's first pixel in X (channel 0 of the group), -1 past the end
  if constexpr (PW) {
    const i64 opix = (i64)Od * Oh * Ow;
#pragma unroll
    for (int j = 0; j < NBC; ++j) {
      i64 p = p0 + ((tid + 256 * j) % BCH) * CH;
      i64 n = p / opix;
      xoff[j] = p < npix ? (n * C + (i64)g * Cg) * opix + (p - n * opix) : -1;
    }
  }
  auto load = [&](int k0) {
#pragma unroll
    for (int j = 0; j < NACH; ++j) {
      int id = tid + 256 * j, mr = m0 + id / KCH, kc = k0 + (id % KCH) * CH;
      if (vec_ok) {
        if (mr < Mg && kc < Kg) {
          ra[j] = gk::load_vec<T, CH>(wg + (i64)mr * Kg + kc);
        } else {
#pragma unroll
          for (int e = 0; e < CH; ++e) ra[j].v[e] = zero;
        }
      } else {
#pragma unroll
        for (int e = 0; e < CH; ++e) ra[j].v[e] = (mr < Mg && kc + e < Kg) ? wg[(i64)mr * Kg + kc + e] : zero;
      }
    }
    if constexpr (PW) {
#pragma unroll
      for (int j = 0; j < NBC; ++j) {
        int kg = k0 + (tid + 256 * j) / BCH;
        if (xoff[j] >= 0 && kg < Kg) {
          rbv[j] = gk::load_vec<T, CH>(x + xoff[j] + (i64)kg * DHW);
        } else {
#pragma unroll
          for (int e = 0; e < CH; ++e) rbv[j].v[e] = zero;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < NB; ++j) rb[j] = gather(x, tab, px, k0 + (tid >> 7) + 2 * j, Kg, Din, Hin, Win, DHW);
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int j = 0; j < NACH; ++j) {
      int id = tid + 256 * j;
      gk::store_vec<T, CH>(&As[buf][id / KCH][(id % KCH) * CH], ra[j]);
    }
    if constexpr (PW) {
#pragma unroll
      for (int j = 0; j < NBC; ++j) {
        int id = tid + 256 * j;
        gk::store_vec<T, CH>(&Bs[buf][id / BCH][(id % BCH) * CH], rbv[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < NB; ++j) Bs[buf][(tid >> 7) + 2 * j][tid & 127] = rb[j];
    }
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int nk = (Kg + BK - 1) / BK;
  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < nk) load((kt + 1) * BK);
#pragma unroll
    for (int ks = 0; ks < BK / TC::KS; ++ks) {
      unsigned af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) TC::load_a(af[i], &As[buf][wm * (BM / 2) + i * 16][ks * TC::KS], ALD, lane);
#pragma unroll
      for (int j2 = 0; j2 < NI / 2; ++j2)
        TC::load_b_kn(bf[2 * j2], bf[2 * j2 + 1], &Bs[buf][ks * TC::KS][wn * 32 + j2 * 16], BLD, lane);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) TC::mma(acc[i][j], af[i], bf[j]);
    }
    if (kt + 1 < nk) store(buf ^ 1);
    __syncthreads();
  }

  const i64 opix = (i64)Od * Oh * Ow;
  i64 yo[NI][2];
#pragma unroll
  for (int j = 0; j < NI; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) yo[j][e] = y_offset(p0 + wn * 32 + j * 8 + 2 * t4 + e, npix, M, opix);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int m = m0 + wm * (BM / 2) + i * 16 + gq + 8 * h;
      if (m >= Mg) continue;
      int ch = g * Mg + m;
      float bv = bias != nullptr ? gk::to_float(bias[ch]) : 0.0f;
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (yo[j][e] >= 0) y[yo[j][e] + (i64)ch * opix] = gk::from_float<T>(acc[i][j][2 * h + e] + bv);
    }
}

// ====================================================================== depthwise (direct)
// Cg == 1: output channel m reads input channel m / Mg only.  One output element per
// thread (grid-stride), taps in a loop, float32 accumulation.
template <class T>
__global__ void __launch_bounds__(256) gk_conv_direct(const T* __restrict__ x, const T* __restrict__ w,
                                                      const T* __restrict__ bias, T* __restrict__ y, int C, int Din,
                                                      int Hin, int Win, int M, int Mg, int Od, int Oh, int Ow, int KD,
                                                      int KH, int KW, int sd, int sh, int sw, int pd, int ph, int pw,
                                                      int dd, int dh, int dw, gk::i64 total) {
  using gk::i64;
  const i64 DHW = (i64)Din * Hin * Win;
  const int ktaps = KD * KH * KW;
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
    i64 r = idx;
    int ow = (int)(r % Ow);
    r /= Ow;
    int oh = (int)(r % Oh);
    r /= Oh;
    int od = (int)(r % Od);
    r /= Od;
    int m = (int)(r % M);
    i64 n = r / M;
    int c = m / Mg;
    const T* xb = x + (n * C + c) * DHW;
    const T* wb = w + (i64)m * ktaps;
    float acc = 0.0f;
    for (int kd = 0; kd < KD; ++kd) {
      int id = od * sd - pd + kd * dd;
      if ((unsigned)id >= (unsigned)Din) continue;
      for (int kh = 0; kh < KH; ++kh) {
        int ih = oh * sh - ph + kh * dh;
        if ((unsigned)ih >= (unsigned)Hin) continue;
        const T* xr = xb + ((i64)id * Hin + ih) * Win;
        const T* wr = wb + (kd * KH + kh) * KW;
        for (int kw = 0; kw < KW; ++kw) {
          int iw = ow * sw - pw + kw * dw;
          if ((unsigned)iw >= (unsigned)Win) continue;
          acc = fmaf(gk::to_float(xr[iw]), gk::to_float(wr[kw]), acc);
        }
      }
    }
    if (bias != nullptr) acc += gk::to_float(bias[m]);
    y[idx] = gk::from_float<T>(acc);
  }
}
