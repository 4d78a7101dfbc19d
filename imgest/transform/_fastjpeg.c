/* imgest's fast JPEG path: decode only the part of a JPEG that a center crop keeps, at libjpeg's DCT scale
 * M/8, and resample it to the output size with an antialiased triangle (bilinear) filter.
 *
 *   check(data, max_pixels=0) -> (width, height) | None: see check() below.
 *   crop_resize(data, scale_num, x0, y0, x1, y1, bx0, by0, bx1, by1, out_w, out_h, flags=0, narrow=0.0)
 *       -> bytes (RGB, out_w*out_h*3). flags: 1 = libjpeg's box chroma upsampling (no "fancy" triangle), 2 = the
 *       fast integer inverse DCT, 4 = a progressive file stops before the scans refining the AC coefficients' last
 *       bit (consume_until_last_bits), 8 = libjpeg's own entropy decoders instead of fast_arith and fast_refine (to
 *       compare them; the pixels are the same), 16 / 32 = the BICUBIC / LANCZOS kernel instead of the triangle. narrow > 0: the filter's width is that fraction of the downscale factor (kept
 *       above 1 pixel), for pixels the DCT scaling has already low-passed. CMYK / YCCK sources come out RGB as
 *       Pillow converts them (see cmyk_to_rgb).
 *   transform(data, resize, crop, quality, max_pixels, dct_scaling, min_ratio, narrow, fancy, last_ac_bits, kernel,
 *             orientation=0, width=0, height=0)
 *       -> (jpeg, width, height) | None: the whole transform of one JPEG (see transform_one); None leaves the file
 *       to the Pillow path. ORIENTATION > 0: the EXIF orientation Pillow read for a file of WIDTH x HEIGHT stored
 *       pixels, in place of the header's (None where libjpeg's size differs). transform_many(list, ...) -> list: the
 *       same for a batch, without the GIL throughout.
 *   arithmetic(data, restart_interval=0) -> bytes: DATA re-encoded losslessly with arithmetic coding (test inputs).
 *
 * (x0, y0, x1, y1) is the pixel region to decode and (bx0 .. by1) the resample box, both in the coordinates of
 * the image scaled by scale_num/8. libjpeg widens the region to whole iMCU columns; the box follows it. Rows
 * above the region are entropy-decoded and skipped, never inverse-transformed; rows below it are not read at
 * all (the caller checks that the file ends with its end marker, so a truncated file is still refused). The filter is Pillow's BILINEAR (support 1, widened by the downscale factor), computed
 * in float: the same weights as Pillow, without its 8-bit intermediate rounding.
 *
 * Sequential arithmetic-coded files are entropy-decoded by fast_arith (libjpeg's algorithm, faster), and the AC
 * refinement scans of progressive Huffman files by fast_refine (libjpeg-turbo 2.x), everywhere, where the build
 * finds libjpeg-turbo's internal header jpegint.h (Debian's libjpeg-dev installs it).
 *
 * Errors raise ValueError with libjpeg's message; a file that ends early (libjpeg's "Premature end of JPEG
 * file") is an error, other libjpeg warnings are ignored, as Pillow ignores them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && defined(__has_include)
#if __has_include(<jpegint.h>)
#include <jpegint.h> /* libjpeg-turbo's entropy decoder interface, for fast_arith */
#define HAVE_FAST_ARITH 1
#endif
#endif

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

/* Open DATA and read its header (then start_scaled below). Call both where a setjmp on the error manager catches
 * libjpeg's errors. */
static void open_jpeg(j_decompress_ptr cinfo, const Py_buffer *data) {
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data->buf, (unsigned long)data->len);
  jpeg_read_header(cinfo, TRUE);
}

/* ---- fast_arith: libjpeg's sequential arithmetic decoder (jdarith.c) with its state in registers ----
 *
 * libjpeg-turbo's arithmetic decoder keeps its coding registers (C, A, CT) in the decoder object and updates the
 * one-byte statistics bins through char pointers, which may alias them: every binary decision reloads and stores
 * the registers, and renormalises one bit at a time. This is the same algorithm (section D.2 of ITU-T T.81;
 * jdarith.c's decode_mcu statement for statement: the same coefficients, the same warnings, the same handling of
 * markers, restarts and the end of the data) with the registers and the input pointer in local variables for one
 * MCU at a time and arith_bit's renormalisation and decision rewritten to the same results: about 1.3x faster.
 * The issue 27 profile had the arithmetic decoder at 24 % of the ImageNet-size real-photo run (14 of its 191
 * files). Only sequential single-scan files take it (what libjpeg has not read yet when jpeg_start_decompress
 * returns); progressive and multi-scan ones keep libjpeg's. */
#ifdef HAVE_FAST_ARITH

#define ARITH_DC_BINS 64
#define ARITH_AC_BINS 256

typedef struct {
  struct jpeg_entropy_decoder pub;
  JLONG c, a; /* jdarith.c's registers between MCUs */
  int ct;
  int last_dc_val[MAX_COMPS_IN_SCAN];
  int dc_context[MAX_COMPS_IN_SCAN];
  unsigned int restarts_to_go;
  unsigned char fixed_bin[4];
  unsigned char dc_stats[NUM_ARITH_TBLS][ARITH_DC_BINS];
  unsigned char ac_stats[NUM_ARITH_TBLS][ARITH_AC_BINS];
} fast_arith_t;

/* The registers of one decode_mcu call: C, A, CT and the unread input (NEXT, LEFT). */
typedef struct {
  JLONG c, a;
  int ct;
  const JOCTET *next;
  size_t left;
} arith_regs;

/* jdarith.c's get_byte once the buffer is empty (jpeg_mem_src then supplies an end marker and warns). */
static __attribute__((noinline)) void arith_refill(j_decompress_ptr cinfo) {
  if (!(*cinfo->src->fill_input_buffer)(cinfo)) ERREXIT(cinfo, JERR_CANT_SUSPEND);
}

static inline __attribute__((always_inline)) int arith_byte(j_decompress_ptr cinfo, arith_regs *r) {
  if (r->left == 0) {
    cinfo->src->next_input_byte = r->next;
    cinfo->src->bytes_in_buffer = 0;
    arith_refill(cinfo);
    r->next = cinfo->src->next_input_byte;
    r->left = cinfo->src->bytes_in_buffer;
  }
  r->left--;
  return *r->next++;
}

/* One input byte into C (jdarith.c's renormalisation: stuffed zeros dropped; at a marker, zeros from then on). */
static inline __attribute__((always_inline)) void arith_load(j_decompress_ptr cinfo, arith_regs *r) {
  int data;
  if (cinfo->unread_marker)
    data = 0;
  else {
    data = arith_byte(cinfo, r);
    if (data == 0xFF) {
      do data = arith_byte(cinfo, r);
      while (data == 0xFF);
      if (data == 0)
        data = 0xFF;
      else {
        cinfo->unread_marker = data;
        data = 0;
      }
    }
  }
  r->c = (r->c << 8) | data;
}

/* jdarith.c's arith_decode: one binary decision with statistics bin ST. Its renormalisation loop shifts A one bit at
 * a time and loads a byte whenever CT runs out; here A shifts by all its leading zeros at once, after the same bytes
 * were loaded, and the decision is computed without branches; the results are jdarith.c's, bit for bit. */
static inline __attribute__((always_inline)) int arith_bit(j_decompress_ptr cinfo, arith_regs *r, unsigned char *st) {
  if (r->a < 0x8000L) {
    if (r->ct < 0) { /* the first two bytes of a scan or restart interval (ct = -16): jdarith.c's loop as it is */
      while (r->a < 0x8000L) {
        if (--r->ct < 0) {
          arith_load(cinfo, r);
          if ((r->ct += 8) < 0)
            if (++r->ct == 0) r->a = 0x8000L;
        }
        r->a <<= 1;
      }
    } else {
      int shift = __builtin_clz((unsigned)r->a) - 16; /* 0 < A < 0x8000: A << shift lands in [0x8000, 0xFFFF] */
      while (shift > r->ct) {
        arith_load(cinfo, r);
        r->ct += 8;
      }
      r->ct -= shift;
      r->a <<= shift;
    }
  }
  int sv = *st;
  JLONG entry = jpeg_aritab[sv & 0x7F];
  JLONG qe = entry >> 16;
  int nl = entry & 0xFF, nm = (entry >> 8) & 0xFF;
  JLONG a = r->a - qe, temp = a << r->ct;
  int upper = r->c >= temp;                 /* C in the sub-interval of size Qe */
  int lps = upper ? a >= qe : a < qe;       /* the conditional exchanges of D.2.4 / D.2.5 */
  int update = upper | (a < 0x8000L);       /* a renormalisation follows: the estimate moves */
  r->c -= upper ? temp : 0;
  r->a = upper ? qe : a;
  *st = (unsigned char)(update ? (sv & 0x80) ^ (lps ? nl : nm) : sv);
  return (sv >> 7) ^ lps;
}

/* jdarith.c's start_pass for a sequential scan (its checks have run in libjpeg's own start_pass already). */
static void fast_arith_start(j_decompress_ptr cinfo) {
  fast_arith_t *e = (fast_arith_t *)cinfo->entropy;
  for (int ci = 0; ci < cinfo->comps_in_scan; ci++) {
    jpeg_component_info *comp = cinfo->cur_comp_info[ci];
    if (comp->dc_tbl_no < 0 || comp->dc_tbl_no >= NUM_ARITH_TBLS)
      ERREXIT1(cinfo, JERR_NO_ARITH_TABLE, comp->dc_tbl_no);
    if (comp->ac_tbl_no < 0 || comp->ac_tbl_no >= NUM_ARITH_TBLS)
      ERREXIT1(cinfo, JERR_NO_ARITH_TABLE, comp->ac_tbl_no);
    memset(e->dc_stats[comp->dc_tbl_no], 0, ARITH_DC_BINS);
    memset(e->ac_stats[comp->ac_tbl_no], 0, ARITH_AC_BINS);
    e->last_dc_val[ci] = 0;
    e->dc_context[ci] = 0;
  }
  e->c = 0;
  e->a = 0;
  e->ct = -16;
  e->pub.insufficient_data = FALSE;
  e->restarts_to_go = cinfo->restart_interval;
}

/* jdarith.c's process_restart (sequential). */
static void fast_arith_restart(j_decompress_ptr cinfo) {
  fast_arith_t *e = (fast_arith_t *)cinfo->entropy;
  if (!(*cinfo->marker->read_restart_marker)(cinfo)) ERREXIT(cinfo, JERR_CANT_SUSPEND);
  for (int ci = 0; ci < cinfo->comps_in_scan; ci++) {
    jpeg_component_info *comp = cinfo->cur_comp_info[ci];
    memset(e->dc_stats[comp->dc_tbl_no], 0, ARITH_DC_BINS);
    e->last_dc_val[ci] = 0;
    e->dc_context[ci] = 0;
    memset(e->ac_stats[comp->ac_tbl_no], 0, ARITH_AC_BINS);
  }
  e->c = 0;
  e->a = 0;
  e->ct = -16;
  e->restarts_to_go = cinfo->restart_interval;
}

/* jdarith.c's decode_mcu (sequential): one MCU's coefficients, in natural order, into the zeroed MCU_DATA blocks
 * (NULL: decoded and dropped, as jpeg_skip_scanlines asks). */
static boolean fast_arith_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  fast_arith_t *e = (fast_arith_t *)cinfo->entropy;
  if (cinfo->restart_interval) {
    if (e->restarts_to_go == 0) fast_arith_restart(cinfo);
    e->restarts_to_go--;
  }
  if (e->ct == -1) return TRUE;
  arith_regs r = {e->c, e->a, e->ct, cinfo->src->next_input_byte, cinfo->src->bytes_in_buffer};
  int bad = 0;
  for (int blkn = 0; blkn < cinfo->blocks_in_MCU && !bad; blkn++) {
    JBLOCKROW block = MCU_data ? MCU_data[blkn] : NULL;
    int ci = cinfo->MCU_membership[blkn];
    jpeg_component_info *comp = cinfo->cur_comp_info[ci];
    int tbl = comp->dc_tbl_no, sign, m, v;
    unsigned char *st = e->dc_stats[tbl] + e->dc_context[ci];
    if (arith_bit(cinfo, &r, st) == 0)
      e->dc_context[ci] = 0;
    else {
      sign = arith_bit(cinfo, &r, st + 1);
      st += 2;
      st += sign;
      if ((m = arith_bit(cinfo, &r, st)) != 0) {
        st = e->dc_stats[tbl] + 20;
        while (arith_bit(cinfo, &r, st)) {
          if ((m <<= 1) == 0x8000) {
            bad = 1;
            break;
          }
          st += 1;
        }
        if (bad) break;
      }
      if (m < (int)((1L << cinfo->arith_dc_L[tbl]) >> 1))
        e->dc_context[ci] = 0;
      else if (m > (int)((1L << cinfo->arith_dc_U[tbl]) >> 1))
        e->dc_context[ci] = 12 + (sign * 4);
      else
        e->dc_context[ci] = 4 + (sign * 4);
      v = m;
      st += 14;
      while (m >>= 1)
        if (arith_bit(cinfo, &r, st)) v |= m;
      v += 1;
      if (sign) v = -v;
      e->last_dc_val[ci] = (e->last_dc_val[ci] + v) & 0xffff;
    }
    if (block) (*block)[0] = (JCOEF)e->last_dc_val[ci];
    tbl = comp->ac_tbl_no;
    unsigned char *ac = e->ac_stats[tbl];
    int kk = cinfo->arith_ac_K[tbl];
    for (int k = 1; k <= DCTSIZE2 - 1; k++) {
      st = ac + 3 * (k - 1);
      if (arith_bit(cinfo, &r, st)) break;
      while (arith_bit(cinfo, &r, st + 1) == 0) {
        st += 3;
        k++;
        if (k > DCTSIZE2 - 1) {
          bad = 1;
          break;
        }
      }
      if (bad) break;
      sign = arith_bit(cinfo, &r, e->fixed_bin);
      st += 2;
      if ((m = arith_bit(cinfo, &r, st)) != 0) {
        if (arith_bit(cinfo, &r, st)) {
          m <<= 1;
          st = ac + (k <= kk ? 189 : 217);
          while (arith_bit(cinfo, &r, st)) {
            if ((m <<= 1) == 0x8000) {
              bad = 1;
              break;
            }
            st += 1;
          }
          if (bad) break;
        }
      }
      v = m;
      st += 14;
      while (m >>= 1)
        if (arith_bit(cinfo, &r, st)) v |= m;
      v += 1;
      if (sign) v = -v;
      if (block) (*block)[jpeg_natural_order[k]] = (JCOEF)v;
    }
  }
  e->c = r.c, e->a = r.a, e->ct = r.ct;
  cinfo->src->next_input_byte = r.next;
  cinfo->src->bytes_in_buffer = r.left;
  if (bad) { /* a magnitude or spectral overflow: jdarith.c warns and decodes nothing more */
    WARNMS(cinfo, JWRN_ARITH_BAD_CODE);
    e->ct = -1;
  }
  return TRUE;
}

/* After jpeg_start_decompress: a sequential arithmetic-coded single-scan file's entropy decoder becomes the one
 * above, in the state libjpeg's start_pass left its own (nothing has been read from the scan yet). */
static void fast_arith(j_decompress_ptr cinfo) {
  if (!cinfo->arith_code || cinfo->progressive_mode || cinfo->buffered_image || cinfo->inputctl->has_multiple_scans ||
      cinfo->output_scanline != 0 || cinfo->input_iMCU_row != 0)
    return;
  fast_arith_t *e = (fast_arith_t *)(*cinfo->mem->alloc_small)((j_common_ptr)cinfo, JPOOL_IMAGE, sizeof(fast_arith_t));
  memset(e, 0, sizeof(*e));
  e->pub.start_pass = fast_arith_start;
  e->pub.decode_mcu = fast_arith_mcu;
  e->fixed_bin[0] = 113;
  cinfo->entropy = &e->pub;
  fast_arith_start(cinfo);
}
#else
static void fast_arith(j_decompress_ptr cinfo) { (void)cinfo; } /* libjpeg's own decoder */
#endif

/* ---- fast_refine: the AC refinement scans of progressive Huffman files (jdphuff.c's decode_mcu_AC_refine) ----
 *
 * Those scans are most of a progressive file's decode time (the issue 44 profile: 72 % of the entropy decoding of
 * ImageNet-size files in the two luma refinement scans). libjpeg walks every coefficient of the band in zigzag order
 * and branches on whether it is already nonzero (one correction bit each) or zero (counted against the run), a
 * branch the data makes unpredictable. fast_refine decodes the same bits into the same coefficients, statement for
 * statement in effect, with the block's nonzero coefficients as a 64-bit mask in zigzag order (SSE2 compares, then
 * a byte-wise table from natural order): a run of zeros is found by clearing the mask's lowest zero bits, and the
 * correction bits go to the set bits only. Its bit buffer is libjpeg's (same layout: jdhuff.h's bitread_perm_state
 * in jdphuff.c's decoder object, libjpeg-turbo 2.x), filled from the source the same way. Whatever is not the plain
 * case (a marker or the end of the data within reach, a fill byte run, restart intervals, a bad code, data already
 * found missing) leaves the MCU, restored, to libjpeg's own function, which then warns, stuffs zeros or resyncs
 * exactly as before. */
#if defined(HAVE_FAST_ARITH) && LIBJPEG_TURBO_VERSION_NUMBER >= 2000000 && LIBJPEG_TURBO_VERSION_NUMBER < 3000000 && \
    SIZE_MAX == UINT64_MAX
#define HAVE_FAST_REFINE 1

typedef struct {
  struct jpeg_entropy_decoder pub;
  struct {
    size_t get_buffer; /* jdhuff.h's bitread_perm_state: bit_buf_type is size_t on 64-bit builds */
    int bits_left;
  } bitstate;
  struct {
    unsigned int EOBRUN; /* jdphuff.c's savable_state */
    int last_dc_val[MAX_COMPS_IN_SCAN];
  } saved;
  unsigned int restarts_to_go;
} refine_entropy_t; /* the head of jdphuff.c's phuff_entropy_decoder, libjpeg-turbo 2.x */

typedef struct {
  unsigned char nb[256], sym[256]; /* a code of at most 8 bits, by the next 8 bits: its length (0: longer), symbol */
  long maxcode[18], valoffset[18]; /* the longer codes, as jdhuff.c's jpeg_huff_decode finds them */
  unsigned char huffval[256];
} refine_table_t;

static __thread struct {
  struct jpeg_progress_mgr progress; /* calls refine_install while jpeg_start_decompress absorbs the scans */
  void (*start_pass)(j_decompress_ptr);
  boolean (*libjpeg_refine)(j_decompress_ptr, JBLOCKROW *);
  refine_table_t tbl;
  unsigned long long fast, delegated; /* MCUs refine_mcu decoded, and those it left to libjpeg (refine_counts) */
  JDIMENSION row_limit;                /* iMCU rows from this one down are never reconstructed (0: none) */
  boolean (*decode)(j_decompress_ptr, JBLOCKROW *); /* this scan's decoder above the limit */
  unsigned long long skipped;          /* MCUs below the limit not decoded (refine_counts) */
} rf;

static uint64_t zigzag_bits[8][256]; /* natural-order byte B of a nonzero mask, value V -> its zigzag-order bits */

static void refine_tables(void) {
  int zz[DCTSIZE2];
  for (int k = 0; k < DCTSIZE2; k++) zz[jpeg_natural_order[k]] = k;
  for (int b = 0; b < 8; b++)
    for (int v = 0; v < 256; v++) {
      uint64_t m = 0;
      for (int j = 0; j < 8; j++)
        if (v >> j & 1) m |= 1ULL << zz[8 * b + j];
      zigzag_bits[b][v] = m;
    }
}

/* jdhuff.c's jpeg_make_d_derived_tbl for table H (libjpeg has already checked it when the scan started). */
static void refine_build(const JHUFF_TBL *h, refine_table_t *t) {
  unsigned int code = 0, huffcode[257];
  int p = 0, l;
  for (l = 1; l <= 16; l++) {
    for (int i = 0; i < h->bits[l]; i++) huffcode[p++] = code++;
    code <<= 1;
  }
  memset(t->nb, 0, sizeof t->nb);
  p = 0;
  for (l = 1; l <= 16; l++) {
    if (h->bits[l]) {
      t->valoffset[l] = (long)p - (long)huffcode[p];
      for (int i = 0; i < h->bits[l]; i++, p++)
        if (l <= 8)
          for (int c = 0; c < 1 << (8 - l); c++) {
            t->nb[(huffcode[p] << (8 - l)) + c] = (unsigned char)l;
            t->sym[(huffcode[p] << (8 - l)) + c] = h->huffval[p];
          }
      t->maxcode[l] = (long)huffcode[p - 1];
    } else {
      t->maxcode[l] = -1;
    }
  }
  memcpy(t->huffval, h->huffval, sizeof t->huffval);
}

/* Bytes of entropy-coded data into BUF until it holds more than 56 bits; a marker (0xFF then not 0) or the end of
 * the data stops it there, unread. */
static inline void refine_fill(const JOCTET **next, size_t *left, size_t *buf, int *bits) {
  while (*bits <= 56 && *left) {
    JOCTET c = **next;
    if (c == 0xFF) {
      if (*left < 2 || (*next)[1] != 0) return;
      *next += 2, *left -= 2;
    } else {
      *next += 1, *left -= 1;
    }
    *buf = (*buf << 8) | c;
    *bits += 8;
  }
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The block's nonzero coefficients as bits of their zigzag positions. */
static inline uint64_t nonzero_zigzag(const JCOEF *block) {
  uint64_t m = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (int b = 0; b < 8; b += 2) {
    __m128i lo = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(block + 8 * b)), zero);
    __m128i hi = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(block + 8 * b + 8)), zero);
    unsigned int z = (unsigned int)_mm_movemask_epi8(_mm_packs_epi16(lo, hi)) ^ 0xFFFFu; /* 16 nonzero flags */
    m |= zigzag_bits[b][z & 0xFF] | zigzag_bits[b + 1][z >> 8];
  }
#else
  for (int b = 0; b < 8; b++) {
    unsigned int v = 0;
    for (int j = 0; j < 8; j++) v |= (unsigned int)(block[8 * b + j] != 0) << j;
    m |= zigzag_bits[b][v];
  }
#endif
  return m;
}

#define REFINE_NEED(n)                           \
  if (bits < (n)) {                              \
    refine_fill(&next, &left, &buf, &bits);      \
    if (bits < (n)) goto libjpegs;               \
  }
/* One correction bit to each coefficient of MASK (zigzag bits), in order: a 1 adds P1 to the magnitude (unless that
 * bit is already set), without a branch on the bit; the bits are made available for the whole mask at once. */
#define REFINE_CORRECT(mask)                                                       \
  {                                                                                \
    uint64_t m_ = (mask);                                                          \
    int n_ = __builtin_popcountll(m_);                                             \
    if (n_ > 56) goto libjpegs; /* never with 57 bits of room; libjpeg's way */    \
    REFINE_NEED(n_);                                                               \
    for (; m_; m_ &= m_ - 1) {                                                     \
      JCOEF *c_ = block + jpeg_natural_order[__builtin_ctzll(m_)];                 \
      int v_ = *c_, bit_ = (int)(buf >> --bits) & 1;                               \
      *c_ = (JCOEF)(v_ + ((v_ >= 0 ? p1 : m1) & -(bit_ & ((v_ & p1) == 0))));      \
    }                                                                              \
  }

static boolean refine_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  refine_entropy_t *e = (refine_entropy_t *)cinfo->entropy;
  if (e->pub.insufficient_data || cinfo->unread_marker) {
    rf.delegated++;
    return rf.libjpeg_refine(cinfo, MCU_data);
  }
  JCOEF *block = MCU_data[0][0], saved[DCTSIZE2];
  memcpy(saved, block, sizeof saved);
  const JOCTET *next = cinfo->src->next_input_byte;
  size_t left = cinfo->src->bytes_in_buffer, buf = e->bitstate.get_buffer;
  int bits = e->bitstate.bits_left, k = cinfo->Ss;
  const int Se = cinfo->Se, p1 = 1 << cinfo->Al, m1 = -p1;
  unsigned int eobrun = e->saved.EOBRUN;
  const uint64_t band = (Se == 63 ? ~0ULL : (1ULL << (Se + 1)) - 1) & (~0ULL << k);
  uint64_t nz = nonzero_zigzag(block) & band;
  if (eobrun == 0) {
    for (; k <= Se; k++) {
      int s, r;
      REFINE_NEED(16);
      int look = (int)(buf >> (bits - 8)) & 0xFF;
      if (rf.tbl.nb[look]) {
        s = rf.tbl.sym[look];
        bits -= rf.tbl.nb[look];
      } else {
        int l = 9;
        long code = (long)(buf >> (bits - 9)) & 0x1FF;
        while (l <= 16 && code > rf.tbl.maxcode[l]) {
          l++;
          code = (long)(buf >> (bits - l)) & ((1L << l) - 1);
        }
        if (l > 16) goto libjpegs; /* a bad code: libjpeg warns */
        s = rf.tbl.huffval[(int)(code + rf.tbl.valoffset[l]) & 0xFF];
        bits -= l;
      }
      r = s >> 4;
      s &= 15;
      if (s) {
        if (s != 1) goto libjpegs; /* a new coefficient must be of size 1: libjpeg warns */
        REFINE_NEED(1);
        s = ((buf >> --bits) & 1) ? p1 : m1;
      } else if (r != 15) {
        eobrun = 1U << r; /* EOBr: the rest of this band and of the next 2^r + bits - 1 */
        if (r) {
          REFINE_NEED(r);
          bits -= r;
          eobrun += (unsigned int)(buf >> bits) & ((1U << r) - 1);
        }
        break;
      }
      /* Past the nonzero coefficients and R zero ones from K, correcting each nonzero one: the target is the zero
       * coefficient after them (the band's end if none). */
      uint64_t zeros = ~nz & band & (~0ULL << k);
      for (int i = 0; i < r && zeros; i++) zeros &= zeros - 1;
      int target = zeros ? __builtin_ctzll(zeros) : Se + 1;
      REFINE_CORRECT(nz & (~0ULL << k) & (target > 63 ? ~0ULL : (1ULL << target) - 1));
      k = target;
      if (s) {
        block[jpeg_natural_order[k]] = (JCOEF)s; /* past the band: libjpeg's order table's spare entries, as there */
        if (k <= 63) nz |= 1ULL << k;
      }
    }
  }
  if (eobrun > 0) {
    REFINE_CORRECT(k > 63 ? 0 : nz & (~0ULL << k));
    eobrun--;
  }
  e->bitstate.get_buffer = buf;
  e->bitstate.bits_left = bits;
  e->saved.EOBRUN = eobrun;
  cinfo->src->next_input_byte = next;
  cinfo->src->bytes_in_buffer = left;
  rf.fast++;
  return TRUE;
libjpegs: /* not the plain case: the block as it was, for libjpeg's own function */
  memcpy(block, saved, sizeof saved);
  rf.delegated++;
  return rf.libjpeg_refine(cinfo, MCU_data);
}

/* An MCU of a scan's iMCU rows below the region: left undecoded (its coefficients are never reconstructed, and the
 * rest of the scan's data is skipped by libjpeg's search for the next marker). */
static boolean tail_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  if (cinfo->input_iMCU_row < rf.row_limit) return rf.decode(cinfo, MCU_data);
  rf.skipped++;
  return TRUE;
}

/* libjpeg's start_pass, then, without restart markers: refine_mcu in place of libjpeg's for an AC refinement scan,
 * and tail_mcu in front of the scan's decoder where a row limit is set (a region's decode). */
static void refine_start_pass(j_decompress_ptr cinfo) {
  rf.start_pass(cinfo);
  if (cinfo->restart_interval != 0) return;
  boolean (*chosen)(j_decompress_ptr, JBLOCKROW *) = cinfo->entropy->decode_mcu;
  int t = cinfo->comps_in_scan == 1 ? cinfo->cur_comp_info[0]->ac_tbl_no : -1;
  if (cinfo->Ss > 0 && cinfo->Ah != 0 && t >= 0 && t < NUM_HUFF_TBLS && cinfo->ac_huff_tbl_ptrs[t]) {
    refine_build(cinfo->ac_huff_tbl_ptrs[t], &rf.tbl);
    rf.libjpeg_refine = chosen;
    chosen = refine_mcu;
  }
  if (rf.row_limit > 0 && rf.row_limit < cinfo->total_iMCU_rows) {
    rf.decode = chosen;
    chosen = tail_mcu;
  }
  cinfo->entropy->decode_mcu = chosen;
}

/* Put refine_start_pass in front of a progressive Huffman decoder's start_pass (once; the scans after this one). */
static void refine_install(j_decompress_ptr cinfo) {
  if (!cinfo->progressive_mode || cinfo->arith_code || !cinfo->entropy ||
      cinfo->entropy->start_pass == refine_start_pass)
    return;
  rf.start_pass = cinfo->entropy->start_pass;
  cinfo->entropy->start_pass = refine_start_pass;
}

static void refine_monitor(j_common_ptr cinfo) { refine_install((j_decompress_ptr)cinfo); }

/* refine_counts() -> (MCUs of AC refinement scans fast_refine decoded, MCUs it left to libjpeg, MCUs of any scan left
 * undecoded below a region) in this thread since the last call; None where fast_refine is not built (a test that names it checks that it ran). */
static PyObject *refine_counts(PyObject *self, PyObject *args) {
  (void)self, (void)args;
  PyObject *out = Py_BuildValue("(KKK)", rf.fast, rf.delegated, rf.skipped);
  rf.fast = rf.delegated = rf.skipped = 0;
  return out;
}
#else
static void refine_tables(void) {}
static PyObject *refine_counts(PyObject *self, PyObject *args) {
  (void)self, (void)args;
  Py_RETURN_NONE;
}
#endif

/* Start decompressing at scale NUM/8 (into colour space CS unless JCS_UNKNOWN); FAST: fast_arith and fast_refine
 * where they apply (off only to compare them with libjpeg's own decoders). ROW_LIMIT > 0: a progressive file's
 * scans leave the iMCU rows from ROW_LIMIT down undecoded (the caller never reads them). */
static void start_scaled(j_decompress_ptr cinfo, int num, J_COLOR_SPACE cs, int fast, JDIMENSION row_limit) {
  if (cs != JCS_UNKNOWN) cinfo->out_color_space = cs;
  cinfo->scale_num = (unsigned int)num;
  cinfo->scale_denom = 8;
#ifdef HAVE_FAST_REFINE
  rf.row_limit = fast ? row_limit : 0;
  if (fast && cinfo->progressive_mode && !cinfo->arith_code) {
    rf.progress.progress_monitor = refine_monitor; /* jpeg_start_decompress calls it before each step of absorbing */
    cinfo->progress = &rf.progress;
  }
#endif
  jpeg_start_decompress(cinfo);
#ifdef HAVE_FAST_REFINE
  if (cinfo->progress == &rf.progress) {
    refine_install(cinfo); /* buffered-image mode: the scans are read after this */
    cinfo->progress = NULL;
  }
#endif
  if (fast) fast_arith(cinfo);
}

/* The resampling kernels, as Pillow defines them (Resample.c): 0 triangle (BILINEAR, support 1), 1 BICUBIC (a = -0.5,
 * support 2), 2 LANCZOS (a = 3, support 3). */
#define KERNELS 3
static const double kernel_support[KERNELS] = {1.0, 2.0, 3.0};

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
static __thread void *scratch[6];
static __thread size_t scratch_cap[6];

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
  float *tab = scratch_buf(5, sizeof(float) * n + 32);
  if (!tab) return NULL;
  tab = (float *)(((uintptr_t)tab + 31) & ~(uintptr_t)31);
  for (int p = 0; p < ow / 2; p++)
    for (int t = 0; t < k->ksize; t++)
      for (int i = 0; i < 8; i++) tab[((size_t)p * k->ksize + t) * 8 + i] = k->w[(size_t)(2 * p + i / 4) * k->ksize + t];
  return tab;
}
#endif

static int use_avx2; /* set at import: the CPU has AVX2 */

/* Separable resample of the w x h RGB region PX (box in its coordinates) to ow x oh: per output row, the vertical
 * taps over contiguous input rows (vectorised), then the horizontal taps per output pixel. */
static int resample(const unsigned char *px, int w, int h, double bx0, double by0, double bx1, double by1, int ow,
                    int oh, double narrow, int kernel, unsigned char *dst) {
  coeffs_t kx = {0}, ky = {0};
  int rc = -1;
  if (make_coeffs(&ky, h, by0, by1, oh, narrow, kernel) || make_coeffs(&kx, w, bx0, bx1, ow, narrow, kernel)) goto done;
  size_t pad = (size_t)kx.ksize * 3 + 4; /* the fourth lane of the last pixel's load; horizontal_pairs' zero taps */
  float *row = scratch_buf(1, sizeof(float) * ((size_t)w * 3 + pad));
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

/* The region decode + resample: decode rows y0..y1 and columns x0..x1 of DATA at scale NUM/8 and resample the box
 * (bx0 .. by1, in the scaled image's coordinates) to OW x OH RGB bytes in DST. 0 on success; -1: libjpeg's message
 * (or the truncation warning) in MSG; -2: the region lies outside the scaled image or the components are not 3
 * (4 for CMYK / YCCK); -3: out of memory. */
typedef struct {
  int num, x0, y0, x1, y1, ow, oh, flags, kernel;
  double bx0, by0, bx1, by1, narrow;
} region_t;

/* Buffered-image mode: read scans until the first one that only refines the last bit of AC coefficients (Ss > 0,
 * Ah > 0, Al = 0) once every component's AC coefficients have had a first pass, or to the end; the number of the last
 * scan read, for jpeg_start_output. What is left unread refines detail that the reduced DCT scale and the resample
 * then average away (issue 27 measured it: PSNR against the reference within 0.02 dB, 38 % less decode time). */
static int consume_until_last_bits(j_decompress_ptr cinfo) {
  for (;;) {
    int ret = jpeg_consume_input(cinfo);
    if (ret == JPEG_REACHED_EOI || ret == JPEG_SUSPENDED) return cinfo->input_scan_number;
    if (ret != JPEG_REACHED_SOS || cinfo->Ss == 0 || cinfo->Ah == 0 || cinfo->Al != 0) continue;
    int seen = 1;
    for (int c = 0; c < cinfo->num_components && seen; c++)
      for (int k = 1; k < DCTSIZE2; k++)
        if (cinfo->coef_bits[c][k] < 0) seen = 0;
    if (!seen) continue;
    /* Starting this scan marked its coefficients exact; they are not read, so they keep the precision of the scans
     * before it, which is what libjpeg's block smoothing of partially known coefficients looks at. */
    for (int i = 0; i < cinfo->comps_in_scan; i++)
      for (int k = cinfo->Ss; k <= cinfo->Se; k++) cinfo->coef_bits[cinfo->cur_comp_info[i]->component_index][k] = cinfo->Ah;
    return cinfo->input_scan_number - 1;
  }
}

/* After jpeg_read_header: decode R's region and resample it into DST (0; -2: region outside the scaled image or
 * components not 3 (4 for CMYK / YCCK); -3: out of memory). libjpeg's errors longjmp to the caller's setjmp. */
static int read_region(j_decompress_ptr cinfo, struct err_mgr *err, const region_t *r, unsigned char *dst) {
  int cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  if (r->flags & 1) cinfo->do_fancy_upsampling = FALSE;
  if (r->flags & 2) cinfo->dct_method = JDCT_IFAST;
  /* The iMCU rows a progressive file's scans must decode: down to the region's last source row, the next one (the
   * upsampler's context) and one spare; the rows below are never reconstructed. */
  JDIMENSION group = (JDIMENSION)(cinfo->max_v_samp_factor * DCTSIZE);
  JDIMENSION limit = ((JDIMENSION)ceil((double)r->y1 * 8.0 / r->num) + group - 1) / group + 2;
  if ((r->flags & 4) && cinfo->progressive_mode) {
    cinfo->buffered_image = TRUE;
    start_scaled(cinfo, r->num, cmyk ? JCS_CMYK : JCS_RGB, !(r->flags & 8), limit);
    jpeg_start_output(cinfo, consume_until_last_bits(cinfo));
  } else {
    start_scaled(cinfo, r->num, cmyk ? JCS_CMYK : JCS_RGB, !(r->flags & 8), limit);
  }
  if ((JDIMENSION)r->x1 > cinfo->output_width || (JDIMENSION)r->y1 > cinfo->output_height ||
      cinfo->output_components != (cmyk ? 4 : 3))
    return -2;
  JDIMENSION xoff = (JDIMENSION)r->x0, w = (JDIMENSION)(r->x1 - r->x0);
  if (r->x0 > 0 || (JDIMENSION)r->x1 < cinfo->output_width) jpeg_crop_scanline(cinfo, &xoff, &w);
  int h = r->y1 - r->y0;
  unsigned char *region = scratch_buf(0, (size_t)w * h * 3); /* per-thread scratch, never freed here */
  unsigned char *inks = cmyk ? scratch_buf(2, (size_t)w * 4) : NULL;
  if (!region || (cmyk && !inks)) return -3;
  if (r->y0 > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)r->y0);
  while (cinfo->output_scanline < (JDIMENSION)r->y1) {
    JDIMENSION at = cinfo->output_scanline - (JDIMENSION)r->y0, left = (JDIMENSION)r->y1 - cinfo->output_scanline;
    if (cmyk) {
      JSAMPROW ink_row = inks;
      jpeg_read_scanlines(cinfo, &ink_row, 1);
      cmyk_to_rgb(inks, region + (size_t)at * w * 3, w);
    } else {
      /* Several rows per call: the merged (box) upsampler then writes its row pairs in place instead of copying
       * each second row out of a spare one. Only rows of the region are asked for, as one at a time would. */
      JSAMPROW rows[16];
      JDIMENSION n = left < 16 ? left : 16;
      for (JDIMENSION i = 0; i < n; i++) rows[i] = region + (size_t)(at + i) * w * 3;
      jpeg_read_scanlines(cinfo, rows, n);
    }
  }
  /* Rows below the region are not read: the caller has checked the end marker (a truncated file). */
  if (err->truncated) return -1;
  if (resample(region, (int)w, h, r->bx0 - xoff, r->by0 - r->y0, r->bx1 - xoff, r->by1 - r->y0, r->ow, r->oh,
               r->narrow, r->kernel, dst))
    return -3;
  return 0;
}

/* The region decode + resample of DATA (see read_region): 0, or -1 with libjpeg's message in MSG, -2, -3. */
static int decode_resample(const unsigned char *data, size_t len, const region_t *r, unsigned char *dst, char *msg) {
  struct jpeg_decompress_struct cinfo;
  struct err_mgr err;
  volatile int rc = 0;
  init_errors(&cinfo, &err);
  if (setjmp(err.jb)) {
    rc = -1;
  } else {
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    rc = read_region(&cinfo, &err, r, dst);
  }
  jpeg_destroy_decompress(&cinfo);
  if (rc == -1) memcpy(msg, err.msg, JMSG_LENGTH_MAX);
  return rc;
}

static PyObject *crop_resize(PyObject *self, PyObject *args) {
  Py_buffer buf;
  region_t r = {0};
  if (!PyArg_ParseTuple(args, "y*iiiiiddddii|id", &buf, &r.num, &r.x0, &r.y0, &r.x1, &r.y1, &r.bx0, &r.by0, &r.bx1,
                        &r.by1, &r.ow, &r.oh, &r.flags, &r.narrow))
    return NULL;
  r.kernel = (r.flags >> 4) & 3;
  if (r.num < 1 || r.num > 16 || r.ow < 1 || r.oh < 1 || r.x0 < 0 || r.y0 < 0 || r.x1 <= r.x0 || r.y1 <= r.y0 ||
      r.kernel >= KERNELS) {
    PyBuffer_Release(&buf);
    PyErr_SetString(PyExc_ValueError, "crop_resize: invalid region, scale or kernel");
    return NULL;
  }
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)r.ow * r.oh * 3);
  if (!out) {
    PyBuffer_Release(&buf);
    return NULL;
  }
  char msg[JMSG_LENGTH_MAX];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = decode_resample(buf.buf, (size_t)buf.len, &r, (unsigned char *)PyBytes_AS_STRING(out), msg);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&buf);
  if (rc) {
    Py_DECREF(out);
    if (rc == -3) return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, rc == -2 ? "crop_resize: region outside the scaled image or not 3 components"
                                                : msg);
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
      start_scaled(&cinfo, 1, JCS_UNKNOWN, 1, 0);
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

/* ---- transform(): header, geometry, region decode, orientation and JPEG encoding in one call (no Pillow image) ----
 *
 * The geometry is imgest.transform.image's, operation for operation in doubles (Python's round() is
 * round-half-even, as nearbyint() is in the default rounding mode), so the pixels are those crop_resize gives for
 * the box _fast_jpeg computes; the encoder is Pillow's JPEG encoder's configuration (libjpeg defaults, quality Q
 * with baseline tables, 4:2:0, no optimisation, JFIF header), so the bytes equal Image.save(..., quality=Q). */

typedef struct {
  int resize, crop, quality, dct_scaling, fancy, last_ac_bits, kernel;
  double max_pixels, min_ratio, narrow;
  /* 0: the header decides; else the EXIF orientation (1-8) and stored size that Pillow read, for a file whose header
   * this path leaves to Pillow (MPO, irregular EXIF): the size must then be libjpeg's too. */
  int orientation, width, height;
} spec_t;

/* What the header says: 0 fine; 1 leave the file to the Pillow path (MPO, unclear EXIF, too large, no end marker). */
typedef struct {
  int orientation;
  int width, height;
} header_t;

static unsigned read16(const unsigned char *p, int big) { return big ? (p[0] << 8) | p[1] : p[0] | (p[1] << 8); }

static unsigned long read32(const unsigned char *p, int big) {
  return big ? ((unsigned long)p[0] << 24) | ((unsigned long)p[1] << 16) | ((unsigned long)p[2] << 8) | p[3]
             : ((unsigned long)p[3] << 24) | ((unsigned long)p[2] << 16) | ((unsigned long)p[1] << 8) | p[0];
}

/* The EXIF orientation of TIFF data D (N bytes, after "Exif\0\0") as Pillow's getexif() reads it from IFD0: 1 when
 * absent; -1 (unsure: let Pillow decide) for anything irregular, -2 when absent (XMP may still say). */
static int exif_orientation(const unsigned char *d, size_t n) {
  if (n < 8) return -1;
  int big;
  if (d[0] == 'I' && d[1] == 'I' && d[2] == 42 && d[3] == 0)
    big = 0;
  else if (d[0] == 'M' && d[1] == 'M' && d[2] == 0 && d[3] == 42)
    big = 1;
  else
    return -1;
  unsigned long ifd = read32(d + 4, big);
  if (ifd < 8 || ifd + 2 > n) return -1;
  unsigned count = read16(d + ifd, big);
  if (ifd + 2 + 12ul * count + 4 > n) return -1;
  int found = -2;
  for (unsigned i = 0; i < count; i++) {
    const unsigned char *e = d + ifd + 2 + 12ul * i;
    if (read16(e, big) != 0x0112) continue;
    unsigned type = read16(e + 2, big);
    if (found != -2 || read32(e + 4, big) != 1) return -1;
    if (type == 3)
      found = (int)read16(e + 8, big);
    else if (type == 4)
      found = (int)read32(e + 8, big);
    else
      return -1;
  }
  return found;
}

/* Pillow's XMP fallback: the digit of the first rb'tiff:Orientation(="|>)([0-9])' in D (N bytes); -2 if none. */
static int xmp_orientation(const unsigned char *d, size_t n) {
  static const char key[] = "tiff:Orientation";
  const size_t k = sizeof(key) - 1;
  for (size_t i = 0; i + k < n; i++) {
    if (d[i] != 't' || memcmp(d + i, key, k)) continue;
    size_t j = i + k;
    if (j + 1 < n && d[j] == '>' && d[j + 1] >= '0' && d[j + 1] <= '9') return d[j + 1] - '0';
    if (j + 2 < n && d[j] == '=' && d[j + 1] == '"' && d[j + 2] >= '0' && d[j + 2] <= '9') return d[j + 2] - '0';
  }
  return -2;
}

/* The EXIF orientation as Pillow's getexif() gives it, from the saved APP1 / APP2 markers: IFD0's tag, else the XMP
 * packet's (the last one, as Pillow keeps it), else 1. -1 where Pillow should decide: MPO (Pillow may open it as
 * MPO), several EXIF blocks (Pillow joins them), irregular EXIF. */
static int header_orientation(j_decompress_ptr cinfo) {
  static const char xmp_prefix[] = "http://ns.adobe.com/xap/1.0/";
  const size_t xp = sizeof(xmp_prefix); /* with its NUL */
  int exif = 0, orientation = -2;
  jpeg_saved_marker_ptr xmp = NULL;
  for (jpeg_saved_marker_ptr m = cinfo->marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 2 && m->data_length >= 4 && !memcmp(m->data, "MPF\0", 4)) return -1;
    if (m->marker != JPEG_APP0 + 1) continue;
    if (m->original_length != m->data_length) return -1;
    if (m->data_length >= xp && !memcmp(m->data, xmp_prefix, xp)) xmp = m;
    if (m->data_length < 6 || memcmp(m->data, "Exif\0\0", 6)) continue;
    if (exif++) return -1;
    orientation = exif_orientation(m->data + 6, m->data_length - 6);
    if (orientation == -1) return -1;
  }
  if (orientation == -2 && xmp) orientation = xmp_orientation(xmp->data + xp, xmp->data_length - xp);
  return orientation == -2 ? 1 : orientation;
}

static double min_d(double a, double b) { return a < b ? a : b; }
static double max_d(double a, double b) { return a > b ? a : b; }

/* image.center_crop_box(width, height, resize, crop, exact=True) */
static void center_crop_box(int width, int height, int resize, int crop, double box[4]) {
  double scale = (double)resize / (width < height ? width : height);
  double rw = max_d(resize, nearbyint(width * scale)), rh = max_d(resize, nearbyint(height * scale));
  double sx = width / rw, sy = height / rh;
  double left = nearbyint((rw - crop) / 2), top = nearbyint((rh - crop) / 2);
  box[0] = left * sx;
  box[1] = top * sy;
  box[2] = (left + crop) * sx;
  box[3] = (top + crop) * sy;
}

/* image.stored_box: BOX (upright) in the stored pixels' coordinates (W x H stored) under ORIENTATION. */
static void stored_box(double b[4], double w, double h, int orientation) {
  double l = b[0], t = b[1], r = b[2], bo = b[3];
  switch (orientation) {
    case 2: b[0] = w - r, b[1] = t, b[2] = w - l, b[3] = bo; break;
    case 3: b[0] = w - r, b[1] = h - bo, b[2] = w - l, b[3] = h - t; break;
    case 4: b[0] = l, b[1] = h - bo, b[2] = r, b[3] = h - t; break;
    case 5: b[0] = t, b[1] = l, b[2] = bo, b[3] = r; break;
    case 6: b[0] = t, b[1] = h - r, b[2] = bo, b[3] = h - l; break;
    case 7: b[0] = w - bo, b[1] = h - r, b[2] = w - t, b[3] = h - l; break;
    case 8: b[0] = w - bo, b[1] = l, b[2] = w - t, b[3] = r; break;
    default: break;
  }
}

/* fastjpeg.scale_eighths and the region fastjpeg.crop_resize decodes for BOX. */
static void plan_region(const spec_t *s, int width, int height, const double box[4], region_t *r) {
  double side = min_d(box[2] - box[0], box[3] - box[1]);
  int m = 8;
  if (s->dct_scaling) {
    static const int tries[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++)
      if (side * tries[i] / 8 >= s->min_ratio * s->crop - 1e-9) {
        m = tries[i];
        break;
      }
  }
  double k = m / 8.0;
  double scaled_w = ceil(width * k), scaled_h = ceil(height * k);
  r->num = m;
  r->bx0 = box[0] * k, r->by0 = box[1] * k, r->bx1 = box[2] * k, r->by1 = box[3] * k;
  double margin = ceil(max_d(r->bx1 - r->bx0, r->by1 - r->by0) / s->crop) + 1;
  r->x0 = (int)max_d(0, floor(r->bx0) - margin), r->y0 = (int)max_d(0, floor(r->by0) - margin);
  r->x1 = (int)min_d(scaled_w, ceil(r->bx1) + margin), r->y1 = (int)min_d(scaled_h, ceil(r->by1) + margin);
  int downscaled = min_d(r->bx1 - r->bx0, r->by1 - r->by0) >= s->crop;
  r->flags = (s->fancy || !downscaled ? 0 : 1) | (s->last_ac_bits || m == 8 ? 0 : 4);
  r->narrow = m < 8 ? s->narrow : 0.0;
  r->kernel = m == 8 ? s->kernel : 0; /* a reduced decode keeps the narrowed triangle (RegionSettings.kernel) */
  r->ow = r->oh = s->crop;
}

/* Pillow's Image.transpose(ORIENTATION_FIX[orientation]) of the N x N RGB image IN into OUT. */
static void orient(const unsigned char *in, unsigned char *out, int n, int orientation) {
  for (int y = 0; y < n; y++) {
    for (int x = 0; x < n; x++) {
      int sx, sy;
      switch (orientation) {
        case 2: sx = n - 1 - x, sy = y; break;
        case 3: sx = n - 1 - x, sy = n - 1 - y; break;
        case 4: sx = x, sy = n - 1 - y; break;
        case 5: sx = y, sy = x; break;
        case 6: sx = y, sy = n - 1 - x; break;
        case 7: sx = n - 1 - y, sy = n - 1 - x; break;
        default: sx = n - 1 - y, sy = x; break; /* 8 */
      }
      memcpy(out + ((size_t)y * n + x) * 3, in + ((size_t)sy * n + sx) * 3, 3);
    }
  }
}

/* Encode the N x N RGB pixels PX as Pillow's JPEG encoder does at QUALITY; *OUT / *OUT_LEN: the JPEG (malloc'ed by
 * libjpeg when it outgrows the scratch buffer it is given: free it unless it is that buffer). 0, or -1 (MSG). */
static int encode_rgb(const unsigned char *px, int n, int quality, unsigned char **out, unsigned long *out_len,
                      char *msg) {
  struct jpeg_compress_struct cinfo;
  struct err_mgr err;
  volatile int rc = 0;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  err.truncated = 0;
  *out_len = (unsigned long)n * n * 3 + 4096;
  *out = scratch_buf(3, *out_len);
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
  unsigned char *px = scratch_buf(4, 2 * n); /* the output pixels, then (turned upright) their copy */
  if (!px) return -3;
  init_errors(&cinfo, &err);
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
      orientation = ok ? header_orientation(&cinfo) : -1;
    if (!ok || orientation < 0 || (s->max_pixels > 0 && pixels_n > s->max_pixels)) {
      rc = 1;
    } else {
      int w = (int)cinfo.image_width, h = (int)cinfo.image_height, turned = orientation >= 5 && orientation <= 8;
      double box[4];
      res->width = turned ? h : w;
      res->height = turned ? w : h;
      center_crop_box(res->width, res->height, s->resize, s->crop, box);
      if (orientation >= 2 && orientation <= 8) stored_box(box, w, h, orientation);
      plan_region(s, w, h, box, &r);
      rc = read_region(&cinfo, &err, &r, px);
      if (rc == -2) rc = 1;
    }
  }
  jpeg_destroy_decompress(&cinfo);
  if (rc == -1) memcpy(msg, err.msg, JMSG_LENGTH_MAX);
  if (rc == 0) {
    const unsigned char *src = px;
    if (orientation >= 2 && orientation <= 8) {
      orient(px, px + n, s->crop, orientation);
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
                  s->orientation <= 8 && s->kernel >= 0 && s->kernel < KERNELS
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

static PyObject *transform(PyObject *self, PyObject *args) {
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
  if (rc == 0 && res.jpeg != scratch[3]) free(res.jpeg);
  return v;
}

/* transform_many(list of bytes, ...) -> list of transform()'s values, the whole batch without the GIL. */
static PyObject *transform_many(PyObject *self, PyObject *args) {
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
    if (rcs[i] == 0 && res[i].jpeg == scratch[3]) { /* the next image reuses the scratch buffer: keep a copy */
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

/* arithmetic(data, restart_interval=0) -> bytes: DATA's coefficients, losslessly re-encoded with arithmetic coding
 * (jpegtran -arithmetic -restart N), sequential: test inputs for fast_arith, which Pillow cannot write. */
static PyObject *arithmetic(PyObject *self, PyObject *args) {
  Py_buffer buf;
  int restart = 0;
  if (!PyArg_ParseTuple(args, "y*|i", &buf, &restart)) return NULL;
  struct jpeg_decompress_struct src;
  struct jpeg_compress_struct dst;
  struct err_mgr err;
  unsigned char *volatile out = NULL;
  volatile unsigned long out_len = 0;
  volatile int failed = 0, dst_made = 0;
  init_errors(&src, &err);
  dst.err = &err.pub; /* one error manager, one setjmp for the whole transcode */
  if (setjmp(err.jb)) {
    failed = 1;
  } else {
    open_jpeg(&src, &buf);
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

static PyMethodDef methods[] = {
    {"arithmetic", arithmetic, METH_VARARGS, "Re-encode a JPEG's coefficients losslessly with arithmetic coding."},
    {"check", check, METH_VARARGS, "Entropy-decode a whole JPEG without rebuilding pixels: (width, height)."},
    {"crop_resize", crop_resize, METH_VARARGS, "Decode a region of a JPEG at scale M/8 and resample it (RGB bytes)."},
    {"transform", transform, METH_VARARGS, "The whole JPEG -> center crop -> JPEG transform: (jpeg, width, height)."},
    {"transform_many", transform_many, METH_VARARGS, "transform() over a list of JPEGs, without the GIL."},
    {"refine_counts", refine_counts, METH_NOARGS, "MCUs of AC refinement scans fast_refine decoded / left to libjpeg."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastjpeg", "Region decode + resample for JPEG.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastjpeg(void) {
#ifdef HAVE_AVX2_PAIRS
  __builtin_cpu_init();
  use_avx2 = __builtin_cpu_supports("avx2");
#endif
  refine_tables();
  PyObject *m = PyModule_Create(&module);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
  if (m && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#endif
  return m;
}
