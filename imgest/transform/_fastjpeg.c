/* imgest's fast JPEG path: decode only the part of a JPEG that a center crop keeps, at libjpeg's DCT scale
 * M/8, and resample it to the output size with an antialiased triangle (bilinear) filter.
 *
 *   check(data) -> None: see check() below.
 *   crop_resize(data, scale_num, x0, y0, x1, y1, bx0, by0, bx1, by1, out_w, out_h) -> bytes (RGB, out_w*out_h*3)
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

/* Pillow's precompute_coeffs for the triangle filter: per output index, first input index, tap count, weights. */
typedef struct {
  int *start;
  int *count;
  float *w;
  int ksize;
} coeffs_t;

static int make_coeffs(coeffs_t *k, int in_size, double in0, double in1, int out_size) {
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
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

HOT static void taps_f(const float *restrict in, float *restrict dst, size_t len, const float *w, int count) {
  for (size_t i = 0; i < len; i++) dst[i] = w[0] * in[i];
  for (int t = 1; t < count; t++) {
    const float *restrict s = in + (size_t)t * len;
    float wt = w[t];
    for (size_t i = 0; i < len; i++) dst[i] += wt * s[i];
  }
}

/* [rows][cols][3] -> [cols][rows][3] */
HOT static void transpose3(const float *restrict in, float *restrict out, int rows, int cols) {
  for (int c = 0; c < cols; c++)
    for (int r = 0; r < rows; r++) {
      const float *s = in + ((size_t)r * cols + c) * 3;
      float *d = out + ((size_t)c * rows + r) * 3;
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
}

HOT static void to_bytes(const float *restrict in, unsigned char *restrict out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = in[i] + 0.5f;
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    out[i] = (unsigned char)(int)v;
  }
}

/* Separable resample of the w x h RGB region PX (box in its coordinates) to ow x oh, in strips of STRIP output
 * rows so the float intermediates stay in cache: vertical taps (contiguous rows), transpose, horizontal taps as
 * contiguous rows of the transposed strip, then back to row order as bytes. */
#define STRIP 16
static int resample(const unsigned char *px, int w, int h, double bx0, double by0, double bx1, double by1, int ow,
                    int oh, unsigned char *dst) {
  coeffs_t kx = {0}, ky = {0};
  int rc = -1;
  float *vert = scratch_buf(1, sizeof(float) * (size_t)(w > ow ? w : ow) * STRIP * 3);
  float *tr = scratch_buf(2, sizeof(float) * (size_t)w * STRIP * 3);
  float *horiz = scratch_buf(3, sizeof(float) * (size_t)ow * STRIP * 3);
  if (!vert || !tr || !horiz) goto done;
  if (make_coeffs(&ky, h, by0, by1, oh) || make_coeffs(&kx, w, bx0, bx1, ow)) goto done;
  for (int y0 = 0; y0 < oh; y0 += STRIP) {
    int rows = oh - y0 < STRIP ? oh - y0 : STRIP;
    for (int r = 0; r < rows; r++)
      taps_u8(px + (size_t)ky.start[y0 + r] * w * 3, vert + (size_t)r * w * 3, (size_t)w * 3,
              ky.w + (size_t)(y0 + r) * ky.ksize, ky.count[y0 + r]);
    transpose3(vert, tr, rows, w); /* [w][rows][3] */
    for (int x = 0; x < ow; x++)
      taps_f(tr + (size_t)kx.start[x] * rows * 3, horiz + (size_t)x * rows * 3, (size_t)rows * 3,
             kx.w + (size_t)x * kx.ksize, kx.count[x]); /* [ow][rows][3] */
    transpose3(horiz, vert, ow, rows); /* [rows][ow][3] */
    to_bytes(vert, dst + (size_t)y0 * ow * 3, (size_t)rows * ow * 3);
  }
  rc = 0;
done:
  free_coeffs(&kx);
  free_coeffs(&ky);
  return rc;
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
  int num, x0, y0, x1, y1, ow, oh;
  double bx0, by0, bx1, by1;
  if (!PyArg_ParseTuple(args, "y*iiiiiddddii", &buf, &num, &x0, &y0, &x1, &y1, &bx0, &by0, &bx1, &by1, &ow, &oh))
    return NULL;
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  unsigned char *volatile region = NULL; /* per-thread scratch, never freed here */
  PyObject *out = NULL;
  int failed = 0, bad_args = 0, no_memory = 0;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.truncated = 0;
  err.msg[0] = 0;
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
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf.buf, (unsigned long)buf.len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = num;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    if ((JDIMENSION)x1 > cinfo.output_width || (JDIMENSION)y1 > cinfo.output_height || cinfo.output_components != 3) {
      bad_args = 1;
    } else {
      JDIMENSION xoff = (JDIMENSION)x0, w = (JDIMENSION)(x1 - x0);
      if (x0 > 0 || (JDIMENSION)x1 < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &w);
      int h = y1 - y0;
      region = scratch_buf(0, (size_t)w * h * 3);
      if (!region) {
        no_memory = 1;
      } else {
        if (y0 > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0);
        while (cinfo.output_scanline < (JDIMENSION)y1) {
          JSAMPROW row = region + (size_t)(cinfo.output_scanline - y0) * w * 3;
          jpeg_read_scanlines(&cinfo, &row, 1);
        }
        /* Rows below the region are not read: the caller has checked the end marker (a truncated file). */
        if (!err.truncated &&
            resample(region, (int)w, h, bx0 - xoff, by0 - y0, bx1 - xoff, by1 - y0, ow, oh,
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

/* check(data): entropy-decode every scanline without inverse DCT or colour conversion (jpeg_skip_scanlines at
 * scale 1/8), so a broken or truncated file raises ValueError; the cheapest check that reads all the data. */
static PyObject *check(PyObject *self, PyObject *args) {
  Py_buffer buf;
  if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  int failed = 0;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.truncated = 0;
  err.msg[0] = 0;
  Py_BEGIN_ALLOW_THREADS
  if (setjmp(err.jb)) {
    failed = 1;
  } else {
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf.buf, (unsigned long)buf.len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.scale_num = 1;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    unsigned char *volatile row = scratch_buf(0, (size_t)cinfo.output_width * cinfo.output_components);
    if (row) {
      skip_to_end(&cinfo, row);
      jpeg_finish_decompress(&cinfo);
    } else {
      failed = 2;
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
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, "Entropy-decode a whole JPEG without reconstructing pixels; ValueError if bad."},
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
