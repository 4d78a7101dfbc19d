/* The resampling filter: Pillow's kernels and weights (Resample.c's precompute_coeffs), computed in float without
 * Pillow's 8-bit intermediate rounding; the vertical pass over contiguous rows, then the horizontal pass per output
 * pixel. The hot loops have AVX2 versions picked at run time (target_clones, use_avx2) that round exactly as the
 * baseline ones (no fused multiply-add: setup.py compiles with -ffp-contract=off), so every CPU gives the same bytes.
 * Also the per-thread scratch buffers every unit draws from. */

#include "fastjpeg_internal.h"

#include <math.h>
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* The resampling kernels, as Pillow defines them (Resample.c): 0 triangle (BILINEAR, support 1), 1 BICUBIC (a = -0.5,
 * support 2), 2 LANCZOS (a = 3, support 3). */
static const double kernel_support[FJ_KERNELS] = {1.0, 2.0, 3.0};

static double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return sin(x) / x;
}

static double kernel_at(int kernel, double x) {
  if (kernel == 1) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
  }
  if (kernel == 2) return (x > -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs for KERNEL: per output index, first input index, tap count, weights. */
typedef struct {
  int *start;
  int *count;
  float *w;
  int ksize;
} coeffs_t;

static int make_coeffs(coeffs_t *k, int in_size, double in0, double in1, int out_size, double narrow, int kernel) {
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  if (narrow > 0.0 && filterscale * narrow > 1.0) filterscale *= narrow;
  double support = kernel_support[kernel] * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
  if (ksize > 64) ksize = 64; /* the taps past 64 are dropped, as below */
  k->ksize = ksize;
  k->start = malloc(sizeof(int) * out_size);
  k->count = malloc(sizeof(int) * out_size);
  k->w = calloc((size_t)out_size * ksize, sizeof(float));
  if (!k->start || !k->count || !k->w) return -1;
  for (int xx = 0; xx < out_size; xx++) {
    double center = in0 + (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
    int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
    if (xmin < 0) xmin = 0;
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    if (xmax > ksize) xmax = ksize;
    double tmp[64];
    for (int x = 0; x < xmax && x < 64; x++) {
      tmp[x] = kernel_at(kernel, (x + xmin - center + 0.5) * ss);
      ww += tmp[x];
    }
    for (int x = 0; x < xmax && x < 64; x++) k->w[(size_t)xx * ksize + x] = (float)(ww != 0.0 ? tmp[x] / ww : 0.0);
    k->start[xx] = xmin;
    k->count[xx] = xmax < 64 ? xmax : 64;
  }
  return 0;
}

static void free_coeffs(coeffs_t *k) {
  free(k->start);
  free(k->count);
  free(k->w);
}


/* Grow-only per-thread scratch buffers: fresh large mallocs would be mmap'ed and page-faulted on every image. */
static __thread void *scratch[FJ_SCRATCH_SLOTS];
static __thread size_t scratch_cap[FJ_SCRATCH_SLOTS];

void *fj_scratch(int slot, size_t bytes) {
  if (scratch_cap[slot] < bytes) {
    void *p = realloc(scratch[slot], bytes);
    if (!p) return NULL;
    scratch[slot] = p;
    scratch_cap[slot] = bytes;
  }
  return scratch[slot];
}

void *fj_scratch_held(int slot) { return scratch[slot]; }

/* The hot loops get an AVX2 clone beside the baseline one, picked at load time (GCC/Clang on x86-64). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("arch=x86-64-v3", "default"), noinline))
#else
#define HOT
#endif

/* dst[i] = sum_t w[t] * row_t[i] for the taps of one output index; rows of `len` values, contiguous. */
HOT static void taps_u8(const unsigned char *restrict in, float *restrict dst, size_t len, const float *w, int count) {
  for (size_t i = 0; i < len; i++) dst[i] = w[0] * (float)in[i];
  for (int t = 1; t < count; t++) {
    const unsigned char *restrict s = in + (size_t)t * len;
    float wt = w[t];
    for (size_t i = 0; i < len; i++) dst[i] += wt * (float)s[i];
  }
}

/* One output row from one row of vertical-pass floats ROW ([w][3], plus one float of padding): each output pixel
 * is the weighted sum of its taps' RGB triples, computed four lanes wide (R, G, B and a lane that is ignored), then
 * rounded to bytes. SSE2's separate multiply and add round exactly like the scalar code, so every CPU gives the
 * same bytes. */
#if defined(__SSE2__)
#include <emmintrin.h>
static void horizontal(const float *row, const coeffs_t *k, int ow, unsigned char *dst) {
  const __m128 half = _mm_set1_ps(0.5f), lo = _mm_setzero_ps(), hi = _mm_set1_ps(255.0f);
  for (int x = 0; x < ow; x++) {
    const float *w = k->w + (size_t)x * k->ksize;
    const float *s = row + (size_t)k->start[x] * 3;
    __m128 acc = _mm_mul_ps(_mm_set1_ps(w[0]), _mm_loadu_ps(s));
    for (int t = 1; t < k->count[x]; t++) acc = _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(w[t]), _mm_loadu_ps(s + 3 * t)));
    acc = _mm_min_ps(_mm_max_ps(_mm_add_ps(acc, half), lo), hi);
    int v[4];
    _mm_storeu_si128((__m128i *)v, _mm_cvttps_epi32(acc));
    dst[3 * x] = (unsigned char)v[0];
    dst[3 * x + 1] = (unsigned char)v[1];
    dst[3 * x + 2] = (unsigned char)v[2];
  }
}
#else
static void horizontal(const float *row, const coeffs_t *k, int ow, unsigned char *dst) {
  for (int x = 0; x < ow; x++) {
    const float *w = k->w + (size_t)x * k->ksize;
    const float *s = row + (size_t)k->start[x] * 3;
    for (int c = 0; c < 3; c++) {
      float acc = w[0] * s[c];
      for (int t = 1; t < k->count[x]; t++) acc = acc + w[t] * s[3 * t + c];
      acc = acc + 0.5f;
      acc = acc < 0.0f ? 0.0f : (acc > 255.0f ? 255.0f : acc);
      dst[3 * x + c] = (unsigned char)(int)acc;
    }
  }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_AVX2_PAIRS 1
/* horizontal() two output pixels at a time in the two halves of an AVX register: each lane does the same multiplies
 * and adds in the same order as horizontal() (no fused multiply-add: -ffp-contract=off), so the bytes are the same.
 * Where one pixel has fewer taps than the other, its extra taps have weight 0 (make_coeffs zero-fills), and adding
 * +0.0 to a non-negative sum changes nothing; ROW must then hold 3 * ksize readable floats past its end. */
/* Round, clamp and store the two RGB pixels of a pair's sums (lanes 0-2 and 4-6) as 6 bytes at D. */
__attribute__((target("avx2"))) static inline void store_pair(__m256 acc, unsigned char *d) {
  const __m256 half = _mm256_set1_ps(0.5f), lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(255.0f);
  const __m128i pick = _mm_setr_epi8(0, 1, 2, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1); /* RGB, RGB */
  __m256i v = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(acc, half), lo), hi)); /* 0..255 */
  __m128i v16 = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  unsigned long long six = (unsigned long long)_mm_cvtsi128_si64(_mm_shuffle_epi8(_mm_packus_epi16(v16, v16), pick));
  memcpy(d, &six, 6);
}

__attribute__((target("avx2"))) static void horizontal_pairs(const float *row, const coeffs_t *k, const float *wtab,
                                                             int ow, unsigned char *dst) {
  int x = 0;
  /* Two pairs per iteration: their independent sums keep more additions in flight. */
  for (; x + 3 < ow; x += 4) {
    const float *w = wtab + (size_t)x * k->ksize * 4, *v = w + (size_t)k->ksize * 8;
    const float *sa = row + (size_t)k->start[x] * 3, *sb = row + (size_t)k->start[x + 1] * 3;
    const float *sc = row + (size_t)k->start[x + 2] * 3, *sd = row + (size_t)k->start[x + 3] * 3;
    int n = k->count[x] > k->count[x + 1] ? k->count[x] : k->count[x + 1];
    int m = k->count[x + 2] > k->count[x + 3] ? k->count[x + 2] : k->count[x + 3];
    __m256 acc = _mm256_mul_ps(_mm256_load_ps(w), _mm256_loadu2_m128(sb, sa));
    __m256 acc2 = _mm256_mul_ps(_mm256_load_ps(v), _mm256_loadu2_m128(sd, sc));
    int both = n < m ? n : m, t = 1;
    for (; t < both; t++) {
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_load_ps(w + 8 * t), _mm256_loadu2_m128(sb + 3 * t, sa + 3 * t)));
      acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(_mm256_load_ps(v + 8 * t), _mm256_loadu2_m128(sd + 3 * t, sc + 3 * t)));
    }
    for (int u = t; u < n; u++)
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_load_ps(w + 8 * u), _mm256_loadu2_m128(sb + 3 * u, sa + 3 * u)));
    for (int u = t; u < m; u++)
      acc2 = _mm256_add_ps(acc2, _mm256_mul_ps(_mm256_load_ps(v + 8 * u), _mm256_loadu2_m128(sd + 3 * u, sc + 3 * u)));
    store_pair(acc, dst + 3 * x);
    store_pair(acc2, dst + 3 * x + 6);
  }
  for (; x + 1 < ow; x += 2) {
    const float *w = wtab + (size_t)x * k->ksize * 4; /* pair x/2: per tap, 4 x weight of x then 4 x of x + 1 */
    const float *sa = row + (size_t)k->start[x] * 3, *sb = row + (size_t)k->start[x + 1] * 3;
    int n = k->count[x] > k->count[x + 1] ? k->count[x] : k->count[x + 1];
    __m256 acc = _mm256_mul_ps(_mm256_load_ps(w), _mm256_loadu2_m128(sb, sa));
    for (int t = 1; t < n; t++)
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_load_ps(w + 8 * t), _mm256_loadu2_m128(sb + 3 * t, sa + 3 * t)));
    store_pair(acc, dst + 3 * x);
  }
  if (x < ow) {
    coeffs_t last = *k;
    last.start += x, last.count += x, last.w += (size_t)x * k->ksize;
    horizontal(row, &last, 1, dst + 3 * x);
  }
}

/* horizontal_pairs' weight table: for pixel pair p and tap t, 8 floats (4 x k->w[2p][t], 4 x k->w[2p + 1][t]). */
static float *pair_weights(const coeffs_t *k, int ow) {
  size_t n = (size_t)(ow / 2) * k->ksize * 8;
  float *tab = fj_scratch(FJ_SCRATCH_WEIGHTS, sizeof(float) * n + 32);
  if (!tab) return NULL;
  tab = (float *)(((uintptr_t)tab + 31) & ~(uintptr_t)31);
  for (int p = 0; p < ow / 2; p++)
    for (int t = 0; t < k->ksize; t++)
      for (int i = 0; i < 8; i++) tab[((size_t)p * k->ksize + t) * 8 + i] = k->w[(size_t)(2 * p + i / 4) * k->ksize + t];
  return tab;
}
#endif

static int use_avx2; /* set at import: the CPU has AVX2 */

void fj_resample_init(void) {
#ifdef HAVE_AVX2_PAIRS
  __builtin_cpu_init();
  use_avx2 = __builtin_cpu_supports("avx2");
#endif
}

/* Separable resample of the w x h RGB region PX (box in its coordinates) to ow x oh: per output row, the vertical
 * taps over contiguous input rows (vectorised), then the horizontal taps per output pixel. */
int fj_resample(const unsigned char *px, int w, int h, double bx0, double by0, double bx1, double by1, int ow, int oh,
                double narrow, int kernel, unsigned char *dst) {
  coeffs_t kx = {0}, ky = {0};
  int rc = -1;
  if (make_coeffs(&ky, h, by0, by1, oh, narrow, kernel) || make_coeffs(&kx, w, bx0, bx1, ow, narrow, kernel)) goto done;
  size_t pad = (size_t)kx.ksize * 3 + 4; /* the fourth lane of the last pixel's load; horizontal_pairs' zero taps */
  float *row = fj_scratch(FJ_SCRATCH_ROW, sizeof(float) * ((size_t)w * 3 + pad));
  if (!row) goto done;
  memset(row + (size_t)w * 3, 0, sizeof(float) * pad);
#ifdef HAVE_AVX2_PAIRS
  const float *wtab = use_avx2 ? pair_weights(&kx, ow) : NULL;
#endif
  for (int y = 0; y < oh; y++) {
    taps_u8(px + (size_t)ky.start[y] * w * 3, row, (size_t)w * 3, ky.w + (size_t)y * ky.ksize, ky.count[y]);
#ifdef HAVE_AVX2_PAIRS
    if (wtab)
      horizontal_pairs(row, &kx, wtab, ow, dst + (size_t)y * ow * 3);
    else
#endif
      horizontal(row, &kx, ow, dst + (size_t)y * ow * 3);
  }
  rc = 0;
done:
  free_coeffs(&kx);
  free_coeffs(&ky);
  return rc;
}
