/* transform(): header, geometry, region decode, orientation and JPEG encoding in one call (no Pillow image), and
 * transform_many(), a batch of them without the GIL (module.c describes both).
 *
 * The pixels are those crop_resize gives for the box image.py computes (orient.c); the encoder is Pillow's JPEG
 * encoder's configuration (libjpeg defaults, quality Q with baseline tables, 4:2:0, no optimisation, JFIF header), so
 * the bytes equal Image.save(..., quality=Q). */

#include "fastjpeg_internal.h"

/* Encode the N x N RGB pixels PX as Pillow's JPEG encoder does at QUALITY; *OUT / *OUT_LEN: the JPEG (malloc'ed by
 * libjpeg when it outgrows the scratch buffer it is given: free it unless it is that buffer). 0, or -1 (MSG). */
static int encode_rgb(const unsigned char *px, int n, int quality, unsigned char **out, unsigned long *out_len,
                      char *msg) {
  struct jpeg_compress_struct cinfo;
  struct err_mgr err;
  volatile int rc = 0;
  cinfo.err = fj_errors(&err);
  *out_len = (unsigned long)n * n * 3 + 4096;
  *out = fj_scratch(FJ_SCRATCH_JPEG, *out_len);
  if (!*out) return -3;
  if (setjmp(err.jb)) {
    rc = -1;
  } else {
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, out, out_len);
    cinfo.image_width = (JDIMENSION)n;
    cinfo.image_height = (JDIMENSION)n;
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
      JSAMPROW row = (JSAMPROW)(px + (size_t)cinfo.next_scanline * n * 3);
      jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
  }
  jpeg_destroy_compress(&cinfo);
  if (rc == -1) memcpy(msg, err.msg, JMSG_LENGTH_MAX);
  return rc;
}

/* True if DATA's last 4096 bytes hold the end marker (image.has_end_marker for JPEG). */
static int has_eoi(const unsigned char *data, size_t len) {
  size_t from = len > 4096 ? len - 4096 : 0;
  for (size_t i = len; i-- > from + 1;)
    if (data[i - 1] == 0xFF && data[i] == 0xD9) return 1;
  return 0;
}

typedef struct {
  unsigned char *jpeg; /* the scratch buffer or a malloc'ed one (see encode_rgb) */
  unsigned long len;
  int width, height; /* the source, upright */
} result_t;

/* One JPEG through the whole transform: 0 with R filled in; 1: not for this path (the Pillow path decides); -1 / -3:
 * libjpeg's error (MSG) / out of memory. Runs without the GIL. */
static int transform_one(const unsigned char *data, size_t len, const spec_t *s, result_t *res, char *msg) {
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  volatile int rc = 0, orientation = 1;
  region_t r = {0};
  if (len < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF || !has_eoi(data, len)) return 1;
  size_t n = (size_t)s->crop * s->crop * 3;
  unsigned char *px = fj_scratch(FJ_SCRATCH_PIXELS, 2 * n); /* the output pixels, then (turned upright) their copy */
  if (!px) return -3;
  cinfo.err = fj_errors(&err);
  if (setjmp(err.jb)) {
    rc = -1;
  } else {
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (unsigned char *)data, (unsigned long)len);
    if (s->orientation <= 0) {
      jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
      jpeg_save_markers(&cinfo, JPEG_APP0 + 2, 0xFFFF);
    }
    jpeg_read_header(&cinfo, TRUE);
    int comps = cinfo.num_components;
    J_COLOR_SPACE cs = cinfo.jpeg_color_space;
    int ok = (comps == 1 && cs == JCS_GRAYSCALE) || (comps == 3 && (cs == JCS_YCbCr || cs == JCS_RGB)) ||
             (comps == 4 && (cs == JCS_CMYK || cs == JCS_YCCK));
    double pixels_n = (double)cinfo.image_width * cinfo.image_height;
    if (s->orientation > 0) /* Pillow's reading, where its size is libjpeg's */
      orientation = ok && (int)cinfo.image_width == s->width && (int)cinfo.image_height == s->height ? s->orientation
                                                                                                    : -1;
    else
      orientation = ok ? fj_header_orientation(&cinfo) : -1;
    if (!ok || orientation < 0 || (s->max_pixels > 0 && pixels_n > s->max_pixels)) {
      rc = 1;
    } else {
      int w = (int)cinfo.image_width, h = (int)cinfo.image_height, turned = orientation >= 5 && orientation <= 8;
      double box[4];
      res->width = turned ? h : w;
      res->height = turned ? w : h;
      fj_center_crop_box(res->width, res->height, s->resize, s->crop, box);
      if (orientation >= 2 && orientation <= 8) fj_stored_box(box, w, h, orientation);
      fj_plan_region(s, w, h, box, &r);
      rc = fj_read_region(&cinfo, &err, &r, px);
      if (rc == -2) rc = 1;
    }
  }
  jpeg_destroy_decompress(&cinfo);
  if (rc == -1) memcpy(msg, err.msg, JMSG_LENGTH_MAX);
  if (rc == 0) {
    const unsigned char *src = px;
    if (orientation >= 2 && orientation <= 8) {
      fj_orient(px, px + n, s->crop, orientation);
      src = px + n;
    }
    rc = encode_rgb(src, s->crop, s->quality, &res->jpeg, &res->len, msg);
  }
  return rc;
}

/* transform()'s arguments after the data: resize, crop, quality, max_pixels, dct_scaling, then the revision's
 * RegionSettings (min_ratio, narrow_when_reduced, fancy_upsampling, last_ac_bits_when_reduced, kernel), then optionally the
 * orientation, width and height Pillow read (spec_t). */
static int parse_spec(PyObject *args, PyObject **first, spec_t *s) {
  s->orientation = s->width = s->height = 0;
  return PyArg_ParseTuple(args, "Oiiididdiii|iii", first, &s->resize, &s->crop, &s->quality, &s->max_pixels,
                          &s->dct_scaling, &s->min_ratio, &s->narrow, &s->fancy, &s->last_ac_bits, &s->kernel,
                          &s->orientation, &s->width, &s->height) &&
         (s->crop >= 1 && s->resize >= s->crop && s->quality >= 1 && s->quality <= 100 && s->orientation >= 0 &&
                  s->orientation <= 8 && s->kernel >= 0 && s->kernel < FJ_KERNELS
              ? 1
              : (PyErr_SetString(PyExc_ValueError, "transform: invalid resize, crop, quality, kernel or orientation"),
                 0));
}

/* The Python value of one result: (jpeg, width, height); None where the Pillow path decides (a file this path does
 * not take, or one libjpeg refuses: Pillow then words the quarantine reason); NULL with MemoryError. */
static PyObject *result_value(int rc, const result_t *res) {
  if (rc == 0) return Py_BuildValue("(y#ii)", (const char *)res->jpeg, (Py_ssize_t)res->len, res->width, res->height);
  if (rc == -3) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

PyObject *fj_py_transform(PyObject *self, PyObject *args) {
  PyObject *obj;
  spec_t s;
  if (!parse_spec(args, &obj, &s)) return NULL;
  Py_buffer buf;
  if (PyObject_GetBuffer(obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
  result_t res = {0};
  char msg[JMSG_LENGTH_MAX] = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = transform_one(buf.buf, (size_t)buf.len, &s, &res, msg);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&buf);
  PyObject *v = result_value(rc, &res);
  if (rc == 0 && res.jpeg != fj_scratch_held(FJ_SCRATCH_JPEG)) free(res.jpeg);
  return v;
}

/* transform_many(list of bytes, ...) -> list of transform()'s values, the whole batch without the GIL. */
PyObject *fj_py_transform_many(PyObject *self, PyObject *args) {
  PyObject *seq;
  spec_t s;
  if (!parse_spec(args, &seq, &s)) return NULL;
  PyObject *fast = PySequence_Fast(seq, "transform_many: expected a sequence of bytes");
  if (!fast) return NULL;
  Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
  const char **bufs = calloc((size_t)count + 1, sizeof(char *));
  Py_ssize_t *lens = calloc((size_t)count + 1, sizeof(Py_ssize_t));
  result_t *res = calloc((size_t)count + 1, sizeof(result_t));
  int *rcs = calloc((size_t)count + 1, sizeof(int));
  PyObject *out = NULL;
  if (!bufs || !lens || !res || !rcs) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < count; i++) {
    char *p;
    if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(fast, i), &p, &lens[i]) < 0) goto done;
    bufs[i] = p;
  }
  Py_BEGIN_ALLOW_THREADS
  char msg[JMSG_LENGTH_MAX];
  for (Py_ssize_t i = 0; i < count; i++) {
    rcs[i] = transform_one((const unsigned char *)bufs[i], (size_t)lens[i], &s, &res[i], msg);
    /* the next image reuses the scratch buffer: keep a copy */
    if (rcs[i] == 0 && res[i].jpeg == fj_scratch_held(FJ_SCRATCH_JPEG)) {
      unsigned char *copy = malloc(res[i].len);
      if (copy) memcpy(copy, res[i].jpeg, res[i].len);
      res[i].jpeg = copy;
      if (!copy) rcs[i] = -3;
    }
  }
  Py_END_ALLOW_THREADS
  out = PyList_New(count);
  for (Py_ssize_t i = 0; out && i < count; i++) {
    PyObject *v = result_value(rcs[i], &res[i]);
    if (rcs[i] == 0) free(res[i].jpeg);
    if (!v) {
      Py_CLEAR(out);
      for (Py_ssize_t j = i + 1; j < count; j++)
        if (rcs[j] == 0) free(res[j].jpeg);
      break;
    }
    PyList_SET_ITEM(out, i, v);
  }
done:
  Py_DECREF(fast);
  free(bufs);
  free(lens);
  free(res);
  free(rcs);
  return out;
}
