/* What the units of imgest's compiled JPEG path share (see module.c for the module's interface):
 *
 *   arith.c      fast_arith: libjpeg's sequential arithmetic decoder with its registers local
 *   refine.c     fast_refine: the AC refinement scans of progressive Huffman files; start_scaled, which installs
 *                both entropy hooks and the row limit of a region's decode
 *   resample.c   the resampling kernels and filter (Pillow's weights, in float; AVX2 clones picked at run time), and
 *                the per-thread scratch buffers
 *   region.c     libjpeg's error handling, the region decode (read_region) and the Python check / crop_resize
 *   orient.c     the EXIF / XMP orientation Pillow reads, the crop's geometry and the turn upright
 *   transform.c  the whole JPEG -> JPEG transform (transform_one, encode_rgb) and Python transform / transform_many
 *   hooks.c      test-only entry points (arithmetic, refine_counts), compiled with FASTJPEG_TEST_HOOKS only
 *   module.c     the Python module: method table and initialisation
 *
 * Functions shared between units carry the fj_ prefix; everything else is static to its unit, where the hot paths
 * (always_inline helpers, __thread state) stay beside their only users. setup.py builds imgest.transform._fastjpeg
 * from these sources, and with IMGEST_BUILD_TEST_HOOKS=1 also imgest.transform._fastjpeg_testing with
 * -DFASTJPEG_TEST_HOOKS. */
#ifndef FASTJPEG_INTERNAL_H
#define FASTJPEG_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && defined(__has_include)
#if __has_include(<jpegint.h>)
#include <jpegint.h> /* libjpeg-turbo's entropy decoder interface, for fast_arith and fast_refine */
#define HAVE_FAST_ARITH 1
#endif
#endif
/* fast_refine reads jdphuff.c's decoder object, whose layout is libjpeg-turbo 2.x's on 64-bit builds. */
#if defined(HAVE_FAST_ARITH) && LIBJPEG_TURBO_VERSION_NUMBER >= 2000000 && LIBJPEG_TURBO_VERSION_NUMBER < 3000000 && \
    SIZE_MAX == UINT64_MAX
#define HAVE_FAST_REFINE 1
#endif

/* Nothing below is exported from the shared object: both modules may be loaded in one process. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* ---- region.c: libjpeg's errors, the region decode ---- */

/* libjpeg errors longjmp to JB with the message in MSG; the "premature end" warning sets TRUNCATED. */
struct err_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
  int truncated;
};

/* ERR's libjpeg error manager, set up as above (assign it to a (de)compressor's err). */
struct jpeg_error_mgr *fj_errors(struct err_mgr *err);
/* Open DATA and read its header (then fj_start_scaled). Call where a setjmp on the error manager catches errors. */
void fj_open_jpeg(j_decompress_ptr cinfo, const Py_buffer *data);

/* A region decode + resample: decode rows y0..y1 and columns x0..x1 at scale NUM/8 and resample the box (bx0 .. by1,
 * in the scaled image's coordinates) to OW x OH RGB bytes. FLAGS: crop_resize's (module.c); KERNEL: 0 triangle,
 * 1 bicubic, 2 lanczos; NARROW > 0: the filter's width as a fraction of the downscale factor. */
typedef struct {
  int num, x0, y0, x1, y1, ow, oh, flags, kernel;
  double bx0, by0, bx1, by1, narrow;
} region_t;

/* After jpeg_read_header: decode R's region and resample it into DST (0; -1: the file is truncated (MSG); -2: region
 * outside the scaled image or components not 3 (4 for CMYK / YCCK); -3: out of memory). libjpeg's errors longjmp
 * to the caller's setjmp. */
int fj_read_region(j_decompress_ptr cinfo, struct err_mgr *err, const region_t *r, unsigned char *dst);

/* ---- arith.c, refine.c: the module's own entropy decoders ---- */

/* After jpeg_start_decompress: a sequential arithmetic-coded single-scan file's entropy decoder becomes fast_arith
 * (nothing where jpegint.h was not found). */
void fj_fast_arith(j_decompress_ptr cinfo);
/* fast_refine's tables, once at import. */
void fj_refine_init(void);
/* Start decompressing at scale NUM/8 (into colour space CS unless JCS_UNKNOWN); FAST: fast_arith and fast_refine
 * where they apply (off only to compare them with libjpeg's own decoders). ROW_LIMIT > 0: a progressive file's
 * scans leave the iMCU rows from ROW_LIMIT down undecoded (the caller never reads them). */
void fj_start_scaled(j_decompress_ptr cinfo, int num, J_COLOR_SPACE cs, int fast, JDIMENSION row_limit);
#ifdef FASTJPEG_TEST_HOOKS
/* fast_refine's counters in this thread since the last call, reset (0); -1 where fast_refine is not built. */
int fj_refine_counts(unsigned long long *fast, unsigned long long *delegated, unsigned long long *skipped);
#endif

/* ---- resample.c: the filter and the scratch buffers ---- */

#define FJ_KERNELS 3 /* 0 triangle (BILINEAR), 1 BICUBIC, 2 LANCZOS: Pillow's definitions */

/* Picks the AVX2 clones where the CPU has AVX2 (once, at import). */
void fj_resample_init(void);
/* Separable resample of the w x h RGB region PX (box in its coordinates) to ow x oh RGB bytes in DST; -1: no memory. */
int fj_resample(const unsigned char *px, int w, int h, double bx0, double by0, double bx1, double by1, int ow, int oh,
                double narrow, int kernel, unsigned char *dst);

/* Grow-only per-thread scratch buffers, one per use (a fresh large malloc would be mmap'ed and page-faulted on every
 * image); never freed by their users. */
enum {
  FJ_SCRATCH_REGION,  /* the decoded region (check: one row) */
  FJ_SCRATCH_ROW,     /* one row of the vertical pass's floats */
  FJ_SCRATCH_INKS,    /* one CMYK row */
  FJ_SCRATCH_JPEG,    /* the encoded output (libjpeg mallocs a larger one when it outgrows this) */
  FJ_SCRATCH_PIXELS,  /* the output pixels and their turned copy */
  FJ_SCRATCH_WEIGHTS, /* horizontal_pairs' weight table */
  FJ_SCRATCH_SLOTS
};
/* SLOT's buffer grown to at least BYTES (NULL: out of memory, the old one kept). */
void *fj_scratch(int slot, size_t bytes);
/* SLOT's current buffer (NULL if never used in this thread). */
void *fj_scratch_held(int slot);

/* ---- orient.c: orientation and geometry ---- */

/* transform()'s settings: resize, crop, quality, max_pixels, dct_scaling, then the revision's RegionSettings. */
typedef struct {
  int resize, crop, quality, dct_scaling, fancy, last_ac_bits, kernel;
  double max_pixels, min_ratio, narrow;
  /* 0: the header decides; else the EXIF orientation (1-8) and stored size that Pillow read, for a file whose header
   * this path leaves to Pillow (MPO, irregular EXIF): the size must then be libjpeg's too. */
  int orientation, width, height;
} spec_t;

/* The EXIF orientation Pillow's getexif() gives from the saved APP1 / APP2 markers; -1: let Pillow decide. */
int fj_header_orientation(j_decompress_ptr cinfo);
/* image.center_crop_box(width, height, resize, crop, exact=True) into BOX. */
void fj_center_crop_box(int width, int height, int resize, int crop, double box[4]);
/* image.stored_box: B (upright) in the stored pixels' coordinates (W x H stored) under ORIENTATION. */
void fj_stored_box(double b[4], double w, double h, int orientation);
/* fastjpeg.scale_eighths and the region fastjpeg.crop_resize decodes for BOX of a WIDTH x HEIGHT image. */
void fj_plan_region(const spec_t *s, int width, int height, const double box[4], region_t *r);
/* Pillow's Image.transpose(ORIENTATION_FIX[orientation]) of the N x N RGB image IN into OUT. */
void fj_orient(const unsigned char *in, unsigned char *out, int n, int orientation);

/* ---- The module's functions (module.c's method table) ---- */

PyObject *fj_py_check(PyObject *self, PyObject *args);
PyObject *fj_py_header(PyObject *self, PyObject *args);
PyObject *fj_py_crop_resize(PyObject *self, PyObject *args);
PyObject *fj_py_transform(PyObject *self, PyObject *args);
PyObject *fj_py_transform_many(PyObject *self, PyObject *args);
#ifdef FASTJPEG_TEST_HOOKS
PyObject *fj_py_arithmetic(PyObject *self, PyObject *args);
PyObject *fj_py_refine_counts(PyObject *self, PyObject *args);
#endif

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif /* FASTJPEG_INTERNAL_H */
