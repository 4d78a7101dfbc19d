/* fast_arith: libjpeg's sequential arithmetic decoder (jdarith.c) with its state in registers.
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

#include "fastjpeg_internal.h"

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
void fj_fast_arith(j_decompress_ptr cinfo) {
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
void fj_fast_arith(j_decompress_ptr cinfo) { (void)cinfo; } /* libjpeg's own decoder */
#endif
