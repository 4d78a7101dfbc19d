/* Entry points for the tests only, compiled with FASTJPEG_TEST_HOOKS (the module imgest.transform._fastjpeg_testing,
 * which setup.py builds where IMGEST_BUILD_TEST_HOOKS=1; make install-dev does): the production module
 * imgest.transform._fastjpeg has neither. */

#include "fastjpeg_internal.h"

#ifdef FASTJPEG_TEST_HOOKS

/* arithmetic(data, restart_interval=0) -> bytes: DATA's coefficients, losslessly re-encoded with arithmetic coding
 * (jpegtran -arithmetic -restart N), sequential: test inputs for fast_arith, which Pillow cannot write. */
PyObject *fj_py_arithmetic(PyObject *self, PyObject *args) {
  Py_buffer buf;
  int restart = 0;
  if (!PyArg_ParseTuple(args, "y*|i", &buf, &restart)) return NULL;
  struct jpeg_decompress_struct src;
  struct jpeg_compress_struct dst;
  struct err_mgr err;
  unsigned char *volatile out = NULL;
  volatile unsigned long out_len = 0;
  volatile int failed = 0, dst_made = 0;
  src.err = dst.err = fj_errors(&err); /* one error manager, one setjmp for the whole transcode */
  if (setjmp(err.jb)) {
    failed = 1;
  } else {
    fj_open_jpeg(&src, &buf);
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(&src);
    jpeg_create_compress(&dst);
    dst_made = 1;
    unsigned char *mem = NULL;
    unsigned long mem_len = 0;
    jpeg_mem_dest(&dst, &mem, &mem_len);
    jpeg_copy_critical_parameters(&src, &dst);
    dst.arith_code = TRUE;
    dst.restart_interval = (unsigned int)(restart > 0 ? restart : 0);
    jpeg_write_coefficients(&dst, coefs);
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    out = mem;
    out_len = mem_len;
  }
  if (dst_made) jpeg_destroy_compress(&dst);
  jpeg_destroy_decompress(&src);
  PyBuffer_Release(&buf);
  PyObject *v = failed ? NULL : PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_len);
  free(out);
  if (failed) PyErr_SetString(PyExc_ValueError, err.msg);
  return v;
}

/* refine_counts() -> (MCUs of AC refinement scans fast_refine decoded, MCUs it left to libjpeg, MCUs of any scan left
 * undecoded below a region) in this thread since the last call; None where fast_refine is not built (a test that
 * names it checks that it ran). */
PyObject *fj_py_refine_counts(PyObject *self, PyObject *args) {
  (void)self, (void)args;
  unsigned long long fast, delegated, skipped;
  if (fj_refine_counts(&fast, &delegated, &skipped) < 0) Py_RETURN_NONE;
  return Py_BuildValue("(KKK)", fast, delegated, skipped);
}
#endif
