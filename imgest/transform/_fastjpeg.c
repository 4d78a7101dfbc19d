/* imgest's fast JPEG path: decode only the part of a JPEG that a center crop keeps, at libjpeg's DCT scale
 * M/8, and resample it to the output size with an antialiased triangle (bilinear) filter.
 *
 *   check(data, max_pixels=0) -> (width, height) | None: see check() below.
 *   crop_resize(data, scale_num, x0, y0, x1, y1, bx0, by0, bx1, by1, out_w, out_h, flags=0, narrow=0.0)
 *       -> bytes (RGB, out_w*out_h*3). flags: 1 = libjpeg's box chroma upsampling (no "fancy" triangle), 2 = the
 *       fast integer inverse DCT. narrow > 0: the filter's width is that fraction of the downscale factor (kept
 *       above 1 pixel), for pixels the DCT scaling has already low-passed. CMYK / YCCK sources come out RGB as
 *       Pillow converts them (see cmyk_to_rgb).
 *
 * (x0, y0, x1, y1) is the pixel region to decode and (bx0 .. by1) the resample box, both in the coordinates of
 * the image scaled by scale_num/8. libjpeg widens the region to whole iMCU columns; the box follows it. Rows
 * above the region are entropy-decoded and skipped, never inverse-transformed; rows below it are not read at
 * all (the caller checks that the file ends with its end marker, so a truncated file is still refused). The filter is Pillow's BILINEAR (support 1, widened by the downscale factor), computed
 * in float: the same weights as Pillow, without its 8-bit intermediate rounding.
 *
 * Errors raise ValueError with libjpeg's message; a file that ends early (libjpeg's "Premature end of JPEG
 * file") is an error, other libjpeg warnings are ignored, as Pillow ignores them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

struct err_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
  int truncated;
};

static void on_error(j_common_ptr c) {
  struct err_mgr *e = (struct err_mgr *)c->err;
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jb, 1);
}

static void on_message(j_common_ptr c, int level) {
  struct err_mgr *e = (struct err_mgr *)c->err;
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF && !e->truncated) {
    (*c->err->format_message)(c, e->msg);
    e->truncated = 1;
  }
}

/* libjpeg errors longjmp back with the message; the "premature end" warning is remembered as truncation. */
static void init_errors(j_decompress_ptr cinfo, struct err_mgr *err) {
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = on_error;
  err->pub.emit_message = on_message;
  err->truncated = 0;
  err->msg[0] = 0;
}

/* Open DATA and read its header; then start decompressing at scale NUM/8 (into colour space CS unless
 * JCS_UNKNOWN). Call both where a setjmp on the error manager catches libjpeg's errors. */
static void open_jpeg(j_decompress_ptr cinfo, const Py_buffer *data) {
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data->buf, (unsigned long)data->len);
  jpeg_read_header(cinfo, TRUE);
}

static void start_scaled(j_decompress_ptr cinfo, int num, J_COLOR_SPACE cs) {
  if (cs != JCS_UNKNOWN) cinfo->out_color_space = cs;
  cinfo->scale_num = (unsigned int)num;
  cinfo->scale_denom = 8;
  jpeg_start_decompress(cinfo);
}

/* Pillow's precompute_coeffs for the triangle filter: per output index, first input index, tap count, weights. */
typedef struct {
  int *start;
  int *count;
  float *w;
  int ksize;
} coeffs_t;

static int make_coeffs(coeffs_t *k, int in_size, double in0, double in1, int out_size, double narrow) {
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  if (narrow > 0.0 && filterscale * narrow > 1.0) filterscale *= narrow;
  double support = 1.0 * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
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
      double t = fabs((x + xmin - center + 0.5) * ss);
      tmp[x] = t < 1.0 ? 1.0 - t : 0.0;
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
static __thread void *scratch[4];
static __thread size_t scratch_cap[4];

static void *scratch_buf(int slot, size_t bytes) {
  if (scratch_cap[slot] < bytes) {
    void *p = realloc(scratch[slot], bytes);
    if (!p) return NULL;
    scratch[slot] = p;
    scratch_cap[slot] = bytes;
  }
  return scratch[slot];
}

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

/* Separable resample of the w x h RGB region PX (box in its coordinates) to ow x oh: per output row, the vertical
 * taps over contiguous input rows (vectorised), then the horizontal taps per output pixel. */
static int resample(const unsigned char *px, int w, int h, double bx0, double by0, double bx1, double by1, int ow,
                    int oh, double narrow, unsigned char *dst) {
  coeffs_t kx = {0}, ky = {0};
  int rc = -1;
  float *row = scratch_buf(1, sizeof(float) * ((size_t)w * 3 + 1));
  if (!row) goto done;
  row[(size_t)w * 3] = 0.0f; /* the fourth lane of the last pixel's load */
  if (make_coeffs(&ky, h, by0, by1, oh, narrow) || make_coeffs(&kx, w, bx0, bx1, ow, narrow)) goto done;
  for (int y = 0; y < oh; y++) {
    taps_u8(px + (size_t)ky.start[y] * w * 3, row, (size_t)w * 3, ky.w + (size_t)y * ky.ksize, ky.count[y]);
    horizontal(row, &kx, ow, dst + (size_t)y * ow * 3);
  }
  rc = 0;
done:
  free_coeffs(&kx);
  free_coeffs(&ky);
  return rc;
}

/* CMYK (YCCK arrives converted to CMYK) to RGB, as Pillow converts it: the samples are Adobe's inverted ones (what
 * Photoshop writes and Pillow assumes for every CMYK JPEG), so with s the stored values, R = s_C * s_K / 255, with
 * Pillow's exact rounding (255 - K) - MULDIV255(C, 255 - K) on the uninverted C = 255 - s_C, K = 255 - s_K. */
static void cmyk_to_rgb(const unsigned char *in, unsigned char *out, JDIMENSION w) {
  for (JDIMENSION x = 0; x < w; x++, in += 4, out += 3) {
    int nk = in[3];
    for (int c = 0; c < 3; c++) {
      int ink = 255 - in[c], tmp = ink * nk + 128;
      out[c] = (unsigned char)(nk - (((tmp >> 8) + tmp) >> 8));
    }
  }
}

/* Entropy-decode the rows after the current one without reconstructing them, then read the last one into ROW
 * (one output row of space). libjpeg skips straight to the end, reading nothing, when asked to skip every
 * remaining row: the last row is read so that a truncated or broken tail is noticed. */
static void skip_to_end(j_decompress_ptr cinfo, unsigned char *row) {
  if (cinfo->output_scanline + 1 < cinfo->output_height)
    jpeg_skip_scanlines(cinfo, cinfo->output_height - cinfo->output_scanline - 1);
  while (cinfo->output_scanline < cinfo->output_height) jpeg_read_scanlines(cinfo, &row, 1);
}

static PyObject *crop_resize(PyObject *self, PyObject *args) {
  Py_buffer buf;
  int num, x0, y0, x1, y1, ow, oh, flags = 0;
  double bx0, by0, bx1, by1, narrow = 0.0;
  if (!PyArg_ParseTuple(args, "y*iiiiiddddii|id", &buf, &num, &x0, &y0, &x1, &y1, &bx0, &by0, &bx1, &by1, &ow, &oh,
                        &flags, &narrow))
    return NULL;
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  unsigned char *volatile region = NULL; /* per-thread scratch, never freed here */
  PyObject *out = NULL;
  int failed = 0, bad_args = 0, no_memory = 0;
  init_errors(&cinfo, &err);
  if (num < 1 || num > 16 || ow < 1 || oh < 1 || x0 < 0 || y0 < 0 || x1 <= x0 || y1 <= y0) {
    PyBuffer_Release(&buf);
    PyErr_SetString(PyExc_ValueError, "crop_resize: invalid region or scale");
    return NULL;
  }
  out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ow * oh * 3);
  if (!out) {
    PyBuffer_Release(&buf);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  if (setjmp(err.jb)) {
    failed = 1;
  } else {
    open_jpeg(&cinfo, &buf);
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    if (flags & 1) cinfo.do_fancy_upsampling = FALSE;
    if (flags & 2) cinfo.dct_method = JDCT_IFAST;
    start_scaled(&cinfo, num, cmyk ? JCS_CMYK : JCS_RGB);
    if ((JDIMENSION)x1 > cinfo.output_width || (JDIMENSION)y1 > cinfo.output_height ||
        cinfo.output_components != (cmyk ? 4 : 3)) {
      bad_args = 1;
    } else {
      JDIMENSION xoff = (JDIMENSION)x0, w = (JDIMENSION)(x1 - x0);
      if (x0 > 0 || (JDIMENSION)x1 < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &w);
      int h = y1 - y0;
      region = scratch_buf(0, (size_t)w * h * 3);
      unsigned char *volatile inks = cmyk ? scratch_buf(2, (size_t)w * 4) : NULL;
      if (!region || (cmyk && !inks)) {
        no_memory = 1;
      } else {
        if (y0 > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0);
        while (cinfo.output_scanline < (JDIMENSION)y1) {
          JSAMPROW row = region + (size_t)(cinfo.output_scanline - y0) * w * 3;
          if (cmyk) {
            JSAMPROW ink_row = inks;
            jpeg_read_scanlines(&cinfo, &ink_row, 1);
            cmyk_to_rgb(inks, row, w);
          } else {
            jpeg_read_scanlines(&cinfo, &row, 1);
          }
        }
        /* Rows below the region are not read: the caller has checked the end marker (a truncated file). */
        if (!err.truncated &&
            resample(region, (int)w, h, bx0 - xoff, by0 - y0, bx1 - xoff, by1 - y0, ow, oh, narrow,
                     (unsigned char *)PyBytes_AS_STRING(out)))
          no_memory = 1;
      }
    }
  }
  jpeg_destroy_decompress(&cinfo);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&buf);
  if (failed || err.truncated || bad_args || no_memory) {
    Py_DECREF(out);
    if (no_memory) return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, bad_args ? "crop_resize: region outside the scaled image or not 3 components"
                                               : err.msg);
    return NULL;
  }
  return out;
}

/* check(data, max_pixels) -> (width, height) | None: entropy-decode every scanline without inverse DCT or colour
 * conversion (jpeg_skip_scanlines at scale 1/8), so a broken or truncated file raises ValueError; the cheapest
 * check that reads all the data. None, decoding nothing, when the header says more than MAX_PIXELS (> 0). */
static PyObject *check(PyObject *self, PyObject *args) {
  Py_buffer buf;
  double max_pixels = 0;
  if (!PyArg_ParseTuple(args, "y*|d", &buf, &max_pixels)) return NULL;
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  int failed = 0, too_large = 0;
  JDIMENSION width = 0, height = 0;
  init_errors(&cinfo, &err);
  Py_BEGIN_ALLOW_THREADS
  if (setjmp(err.jb)) {
    failed = 1;
  } else {
    open_jpeg(&cinfo, &buf);
    width = cinfo.image_width;
    height = cinfo.image_height;
    if (max_pixels > 0 && (double)width * (double)height > max_pixels) {
      too_large = 1;
    } else {
      start_scaled(&cinfo, 1, JCS_UNKNOWN);
      unsigned char *volatile row = scratch_buf(0, (size_t)cinfo.output_width * cinfo.output_components);
      if (row) {
        skip_to_end(&cinfo, row);
        jpeg_finish_decompress(&cinfo);
      } else {
        failed = 2;
      }
    }
  }
  jpeg_destroy_decompress(&cinfo);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&buf);
  if (failed == 2) return PyErr_NoMemory();
  if (failed || err.truncated) {
    PyErr_SetString(PyExc_ValueError, err.msg);
    return NULL;
  }
  if (too_large) Py_RETURN_NONE;
  return Py_BuildValue("(II)", (unsigned int)width, (unsigned int)height);
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, "Entropy-decode a whole JPEG without rebuilding pixels: (width, height)."},
    {"crop_resize", crop_resize, METH_VARARGS, "Decode a region of a JPEG at scale M/8 and resample it (RGB bytes)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastjpeg", "Region decode + resample for JPEG.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastjpeg(void) {
  PyObject *m = PyModule_Create(&module);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
  if (m && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#endif
  return m;
}
