/* The orientation and the geometry of transform(): the EXIF / XMP orientation as Pillow reads it from the header,
 * the center crop's box (upright, then in the stored pixels' coordinates), the region and DCT scale that decode it,
 * and the turn of the output upright.
 *
 * The geometry is imgest.transform.image's, operation for operation in doubles (Python's round() is
 * round-half-even, as nearbyint() is in the default rounding mode), so the pixels are those crop_resize gives for
 * the box _fast_jpeg computes. */

#include "fastjpeg_internal.h"

#include <math.h>

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
int fj_header_orientation(j_decompress_ptr cinfo) {
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
void fj_center_crop_box(int width, int height, int resize, int crop, double box[4]) {
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
void fj_stored_box(double b[4], double w, double h, int orientation) {
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
void fj_plan_region(const spec_t *s, int width, int height, const double box[4], region_t *r) {
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
void fj_orient(const unsigned char *in, unsigned char *out, int n, int orientation) {
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
