/* imgest's fast JPEG path: decode only the part of a JPEG that a center crop keeps, at libjpeg's DCT scale
 * M/8, and resample it to the output size with an antialiased triangle (bilinear) filter.
 *
 *   check(data, max_pixels=0) -> (width, height) | None: see fj_py_check (region.c).
 *   header(data) -> (width, height): the header up to the first scan, nothing decoded (fj_py_header, region.c).
 *   crop_resize(data, scale_num, x0, y0, x1, y1, bx0, by0, bx1, by1, out_w, out_h, flags=0, narrow=0.0)
 *       -> bytes (RGB, out_w*out_h*3). flags: 1 = libjpeg's box chroma upsampling (no "fancy" triangle), 2 = the
 *       fast integer inverse DCT, 4 = a progressive file stops before the scans refining the AC coefficients' last
 *       bit (consume_until_last_bits), 8 = libjpeg's own entropy decoders instead of fast_arith and fast_refine (to
 *       compare them; the pixels are the same), 16 / 32 = the BICUBIC / LANCZOS kernel instead of the triangle.
 *       narrow > 0: the filter's width is that fraction of the downscale factor (kept above 1 pixel), for pixels
 *       the DCT scaling has already low-passed. CMYK / YCCK sources come out RGB as Pillow converts them (see
 *       region.c's cmyk_to_rgb).
 *   transform(data, resize, crop, quality, max_pixels, dct_scaling, min_ratio, narrow, fancy, last_ac_bits, kernel,
 *             orientation=0, width=0, height=0)
 *       -> (jpeg, width, height) | None: the whole transform of one JPEG (transform.c's transform_one); None leaves
 *       the file to the Pillow path. ORIENTATION > 0: the EXIF orientation Pillow read for a file of WIDTH x HEIGHT
 *       stored pixels, in place of the header's (None where libjpeg's size differs). transform_many(list, ...) ->
 *       list: the same for a batch, without the GIL throughout.
 *
 * The test module imgest.transform._fastjpeg_testing (the same sources with FASTJPEG_TEST_HOOKS: hooks.c) also has
 *   arithmetic(data, restart_interval=0) -> bytes: DATA re-encoded losslessly with arithmetic coding (test inputs);
 *   refine_counts() -> (fast, delegated, skipped): fast_refine's MCU counters in this thread since the last call.
 *
 * (x0, y0, x1, y1) is the pixel region to decode and (bx0 .. by1) the resample box, both in the coordinates of
 * the image scaled by scale_num/8. libjpeg widens the region to whole iMCU columns; the box follows it. Rows
 * above the region are entropy-decoded and skipped, never inverse-transformed; rows below it are not read at
 * all (the caller checks that the file ends with its end marker, so a truncated file is still refused). The filter
 * is Pillow's BILINEAR (support 1, widened by the downscale factor), or its BICUBIC / LANCZOS (resample.c), computed
 * in float: the same weights as Pillow, without its 8-bit intermediate rounding.
 *
 * Sequential arithmetic-coded files are entropy-decoded by fast_arith (arith.c: libjpeg's algorithm, faster), and the
 * AC refinement scans of progressive Huffman files by fast_refine (refine.c: libjpeg-turbo 2.x), everywhere, where the
 * build finds libjpeg-turbo's internal header jpegint.h (Debian's libjpeg-dev installs it).
 *
 * Errors raise ValueError with libjpeg's message; a file that ends early (libjpeg's "Premature end of JPEG
 * file") is an error, other libjpeg warnings are ignored, as Pillow ignores them.
 *
 * This unit is the Python module (method table, initialisation); fastjpeg_internal.h lists the others.
 */

#include "fastjpeg_internal.h"

#ifdef FASTJPEG_TEST_HOOKS
#define FJ_MODULE_NAME "_fastjpeg_testing"
#define FJ_MODULE_INIT PyInit__fastjpeg_testing
#else
#define FJ_MODULE_NAME "_fastjpeg"
#define FJ_MODULE_INIT PyInit__fastjpeg
#endif

static PyMethodDef methods[] = {
#ifdef FASTJPEG_TEST_HOOKS
    {"arithmetic", fj_py_arithmetic, METH_VARARGS,
     "Re-encode a JPEG's coefficients losslessly with arithmetic coding."},
#endif
    {"check", fj_py_check, METH_VARARGS, "Entropy-decode a whole JPEG without rebuilding pixels: (width, height)."},
    {"header", fj_py_header, METH_VARARGS, "Read a JPEG's header up to its first scan: (width, height)."},
    {"crop_resize", fj_py_crop_resize, METH_VARARGS,
     "Decode a region of a JPEG at scale M/8 and resample it (RGB bytes)."},
    {"transform", fj_py_transform, METH_VARARGS,
     "The whole JPEG -> center crop -> JPEG transform: (jpeg, width, height)."},
    {"transform_many", fj_py_transform_many, METH_VARARGS, "transform() over a list of JPEGs, without the GIL."},
#ifdef FASTJPEG_TEST_HOOKS
    {"refine_counts", fj_py_refine_counts, METH_NOARGS,
     "MCUs of AC refinement scans fast_refine decoded / left to libjpeg."},
#endif
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, FJ_MODULE_NAME, "Region decode + resample for JPEG.", -1,
                                    methods};

PyMODINIT_FUNC FJ_MODULE_INIT(void) {
  fj_resample_init();
  fj_refine_init();
  PyObject *m = PyModule_Create(&module);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
  if (m && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#endif
  return m;
}
