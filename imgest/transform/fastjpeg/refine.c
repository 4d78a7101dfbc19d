/* fast_refine: the AC refinement scans of progressive Huffman files (jdphuff.c's decode_mcu_AC_refine), and
 * start_scaled, which starts every decode and installs the module's entropy hooks.
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

#include "fastjpeg_internal.h"

#ifdef HAVE_FAST_REFINE

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

/* The table nonzero_zigzag reads (once, at import). */
void fj_refine_init(void) {
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

#ifdef FASTJPEG_TEST_HOOKS
/* The counters behind the test hook refine_counts() (hooks.c): MCUs of AC refinement scans fast_refine decoded, MCUs
 * it left to libjpeg, MCUs of any scan left undecoded below a region, in this thread since the last call. */
int fj_refine_counts(unsigned long long *fast, unsigned long long *delegated, unsigned long long *skipped) {
  *fast = rf.fast, *delegated = rf.delegated, *skipped = rf.skipped;
  rf.fast = rf.delegated = rf.skipped = 0;
  return 0;
}
#endif
#else
void fj_refine_init(void) {}
#ifdef FASTJPEG_TEST_HOOKS
int fj_refine_counts(unsigned long long *fast, unsigned long long *delegated, unsigned long long *skipped) {
  *fast = *delegated = *skipped = 0;
  return -1;
}
#endif
#endif

/* Start decompressing at scale NUM/8 (see fastjpeg_internal.h): fast_refine's hooks go in while
 * jpeg_start_decompress absorbs the scans, fast_arith's after it. */
void fj_start_scaled(j_decompress_ptr cinfo, int num, J_COLOR_SPACE cs, int fast, JDIMENSION row_limit) {
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
  if (fast) fj_fast_arith(cinfo);
}
