/* Strict reader for one .safetensors file: checks every rule of the format before trusting a byte. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_checksum.h"
#include "sd_grow.h"
#include "sd_jscan.h"
#include "sd_layout.h"
#include "sd_nameidx.h"
#include "sd_reader.h"

/* Names inside messages are cut and cleaned so a hostile name cannot drown
 * or corrupt the rest of the message. */
#define SHOW(buf, s) sd_msgstr(buf, sizeof buf, s, strlen(s))

/* ------------------------------------------------------------------------ *
 * Helpers
 * ------------------------------------------------------------------------ */

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* "F32[3,4]": how messages show a tensor's type and shape. */
static void fmt_type(char *buf, size_t sz, sd_dtype dt, uint32_t ndim, const uint64_t *shape) {
  size_t n = (size_t)snprintf(buf, sz, "%s[", sd_dtype_name(dt));
  for (uint32_t i = 0; i < ndim && n < sz; i++)
    n += (size_t)snprintf(buf + n, sz - n, "%s%" PRIu64, i ? "," : "", shape[i]);
  if (n < sz) snprintf(buf + n, sz - n, "]");
}

/* The number at c as a uint64_t: -1 for a real, a negative integer or anything but a number. */
static int scan_u64(sd_jcur *c, uint64_t *out) {
  char k = sd_jcur_peek(c);
  if (!(k == '-' || (k >= '0' && k <= '9'))) {
    sd_jcur_skip(c);
    return -1;
  }
  int64_t v = 0;
  if (!sd_jcur_number(c, &v) || v < 0) return -1;
  *out = (uint64_t)v;
  return 0;
}

static int dup_key(const char *label, size_t at, const char *key, sd_error *err) {
  char kb[SD_MSGNAME_MAX];
  return sd_fail(err, SHARDD_E_FORMAT, "%s: header is not valid JSON at byte %zu: duplicate object key '%s'", label,
                 at, SHOW(kb, key));
}

/* Length prefix rules, shared by the pure parser and the file reader so the
 * file reader never allocates for a header it would refuse. */
static int check_prefix(const char *label, const void *buf, size_t len, uint64_t file_size,
                        uint64_t *hl, sd_error *err) {
  *hl = 0; /* set on every path: callers read it only on success, but the compiler cannot know */
  if (file_size < 8)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                   label, file_size);
  if (len < 8)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: only %zu bytes given, the header length needs 8",
                   label, len);
  *hl = le64(buf);
  if (*hl > SD_HEADER_MAX)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: header length %" PRIu64 " exceeds the limit of %llu bytes", label, *hl,
                   (unsigned long long)SD_HEADER_MAX);
  if (*hl > file_size - 8)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64
                   " bytes)",
                   label, *hl, file_size);
  return 0;
}

void sd_st_header_free(sd_st_header *h) {
  if (!h) return;
  for (size_t i = 0; i < h->ntensors; i++) free(h->tensors[i].name);
  for (size_t i = 0; i < h->nmeta; i++) {
    free(h->meta[i].key);
    free(h->meta[i].value);
  }
  free(h->tensors);
  free(h->meta);
  memset(h, 0, sizeof *h);
}

/* ------------------------------------------------------------------------ *
 * Header entries
 * ------------------------------------------------------------------------ */

static const char *meta_key(const void *ctx, uint32_t i) { return ((const sd_st_header *)ctx)->meta[i].key; }
static const char *tensor_name(const void *ctx, uint32_t i) { return ((const sd_st_header *)ctx)->tensors[i].name; }

static int parse_metadata(const char *label, sd_jcur *c, sd_st_header *h, sd_error *err) {
  if (sd_jcur_peek(c) != '{')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: __metadata__ is not an object of strings", label);
  sd_nameidx seen;
  sd_nameidx_init(&seen);
  size_t cap = 0;
  int rc = 0;
  sd_jcur_enter(c);
  while (!rc && sd_jcur_more(c)) {
    size_t at = sd_jcur_at(c);
    char *k = sd_jcur_key(c);
    if (!k) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    if (sd_nameidx_find(&seen, k, meta_key, h) != SD_NAMEIDX_NONE) {
      rc = dup_key(label, at, k, err);
      free(k);
      break;
    }
    if (sd_jcur_peek(c) != '"') {
      char kb[SD_MSGNAME_MAX];
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: __metadata__ '%s' is not a string", label, SHOW(kb, k));
      free(k);
      break;
    }
    char *v = malloc(sd_jcur_strmax(c) + 1);
    if (!v || SD_GROW(h->meta, cap, h->nmeta + 1, 8) ||
        sd_nameidx_insert(&seen, k, (uint32_t)h->nmeta, meta_key, h) != 0) {
      free(k);
      free(v);
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    sd_jcur_string(c, v);
    h->meta[h->nmeta++] = (sd_st_meta){k, v};
  }
  sd_nameidx_free(&seen);
  return rc;
}

/* A tensor's three fields, found in any order, each once; anything else is refused. */
typedef struct {
  sd_jcur dtype, shape, offsets;
  int has_dtype, has_shape, has_offsets;
} tensor_fields;

static int scan_fields(const char *label, const char *name, sd_jcur *c, tensor_fields *f, sd_error *err) {
  memset(f, 0, sizeof *f);
  sd_jcur_enter(c);
  while (sd_jcur_more(c)) {
    size_t at = sd_jcur_at(c);
    char *k = sd_jcur_key(c);
    if (!k) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    int *has = !strcmp(k, "dtype") ? &f->has_dtype : !strcmp(k, "shape") ? &f->has_shape
             : !strcmp(k, "data_offsets") ? &f->has_offsets : NULL;
    sd_jcur *at_value = has == &f->has_dtype ? &f->dtype : has == &f->has_shape ? &f->shape : &f->offsets;
    if (!has) {
      char kb[SD_MSGNAME_MAX];
      int rc = sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': unexpected field '%s'", label, name, SHOW(kb, k));
      free(k);
      return rc;
    }
    if (*has) {
      int rc = dup_key(label, at, k, err);
      free(k);
      return rc;
    }
    free(k);
    *has = 1;
    sd_jcur_peek(c);
    *at_value = *c;
    sd_jcur_skip(c);
  }
  return 0;
}

static int parse_tensor(const char *label, const char *raw, sd_jcur *c, sd_st_tensor *t, sd_error *err) {
  char name[SD_MSGNAME_MAX], kb[SD_MSGNAME_MAX];
  SHOW(name, raw);
  if (sd_jcur_peek(c) != '{')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s' is not an object", label, name);
  tensor_fields f;
  int rc = scan_fields(label, name, c, &f, err);
  if (rc) return rc;
  const char *missing = !f.has_dtype ? "dtype" : !f.has_shape ? "shape" : !f.has_offsets ? "data_offsets" : NULL;
  if (missing)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': missing '%s'", label, name, missing);

  if (sd_jcur_peek(&f.dtype) != '"')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': dtype is not a string", label, name);
  char dt[32], *dtl = sd_jcur_strmax(&f.dtype) < sizeof dt ? dt : malloc(sd_jcur_strmax(&f.dtype) + 1);
  if (!dtl) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  sd_jcur_string(&f.dtype, dtl);
  sd_error sub;
  sd_error_clear(&sub);
  if (sd_dtype_parse(dtl, &t->dtype, &sub) != 0) {
    rc = sub.msg[0] ? sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s", label, name, sub.msg)
                    : sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': unknown dtype '%s'", label, name, SHOW(kb, dtl));
    if (dtl != dt) free(dtl);
    return rc;
  }
  if (dtl != dt) free(dtl);

  if (sd_jcur_peek(&f.shape) != '[')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': shape is not an array", label, name);
  size_t ndim = 0;
  sd_jcur count = f.shape;
  sd_jcur_enter(&count);
  while (sd_jcur_more(&count)) {
    sd_jcur_skip(&count);
    ndim++;
  }
  if (ndim > SD_MAX_DIMS)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': shape has %zu dimensions, over %d",
                   label, name, ndim, SD_MAX_DIMS);
  t->ndim = (uint32_t)ndim;
  sd_jcur_enter(&f.shape);
  for (uint32_t i = 0; sd_jcur_more(&f.shape); i++) {
    if (scan_u64(&f.shape, &t->shape[i]) != 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: tensor '%s': shape[%" PRIu32 "] is not a non-negative integer", label,
                     name, i);
  }
  /* The type as messages show it, made only for one: a million tensors must not each print it. */
  char ty[SD_MAX_DIMS * 21 + 32];
  if (sd_tensor_numel(raw, t->ndim, t->shape, &t->numel, &sub) != 0) {
    fmt_type(ty, sizeof ty, t->dtype, t->ndim, t->shape);
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s element count overflows", label,
                   name, ty);
  }
  unsigned esz = sd_dtype_size(t->dtype);
  if (t->numel > UINT64_MAX / esz) {
    fmt_type(ty, sizeof ty, t->dtype, t->ndim, t->shape);
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s byte size overflows 64 bits",
                   label, name, ty);
  }
  uint64_t nbytes = t->numel * esz;

  int n = 0, ok = sd_jcur_peek(&f.offsets) == '[';
  if (ok) {
    sd_jcur_enter(&f.offsets);
    for (; sd_jcur_more(&f.offsets); n++) {
      uint64_t v = 0;
      if (scan_u64(&f.offsets, &v) != 0 || n >= 2) ok = 0; /* read either way: the walk goes on past it */
      else *(n ? &t->end : &t->begin) = v;
    }
  }
  if (!ok || n != 2)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets is not [begin, end] of non-negative integers",
                   label, name);
  if (t->end < t->begin)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] end before begin",
                   label, name, t->begin, t->end);
  if (t->end - t->begin != nbytes) {
    fmt_type(ty, sizeof ty, t->dtype, t->ndim, t->shape);
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] but %s needs %" PRIu64
                   " bytes",
                   label, name, t->begin, t->end, ty, nbytes);
  }
  return 0;
}

static int cmp_offsets(const void *a, const void *b) {
  const sd_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Sorted by offsets, the tensors must tile [0, data_size) exactly: any
 * hole, overlap or trailing byte is refused, as the reference reader does. */
static int check_layout(const char *label, const sd_st_header *h, sd_error *err) {
  uint64_t expect = 0;
  char a[SD_MSGNAME_MAX], b[SD_MSGNAME_MAX];
  for (size_t i = 0; i < h->ntensors; i++) {
    const sd_st_tensor *t = &h->tensors[i];
    if (t->begin > expect) {
      if (i == 0)
        return sd_fail(err, SHARDD_E_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                       "] do not start at 0 (hole of %" PRIu64 " bytes)",
                       label, SHOW(a, t->name), t->begin, t->end, t->begin);
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: hole of %" PRIu64 " bytes between tensor '%s' (ends at %" PRIu64
                     ") and tensor '%s' (starts at %" PRIu64 ")",
                     label, t->begin - expect, SHOW(a, h->tensors[i - 1].name), expect, SHOW(b, t->name),
                     t->begin);
    }
    if (t->begin < expect) {
      const sd_st_tensor *p = &h->tensors[i - 1];
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: tensor '%s' data_offsets [%" PRIu64 ",%" PRIu64
                     "] overlap tensor '%s' [%" PRIu64 ",%" PRIu64 "]",
                     label, SHOW(a, t->name), t->begin, t->end, SHOW(b, p->name), p->begin, p->end);
    }
    if (t->end > h->data_size)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: tensor '%s' data_offsets [%" PRIu64 ",%" PRIu64
                     "] run past the end of the file (data section is %" PRIu64
                     " bytes): the file is truncated",
                     label, SHOW(a, t->name), t->begin, t->end, h->data_size);
    expect = t->end;
  }
  if (expect != h->data_size)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: %" PRIu64 " trailing byte%s after the last tensor (tensors end at %" PRIu64
                   ", data section is %" PRIu64 " bytes)",
                   label, h->data_size - expect, h->data_size - expect == 1 ? "" : "s", expect,
                   h->data_size);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * The pure parser
 * ------------------------------------------------------------------------ */

static int parse_json(const char *label, const char *js, uint64_t hl, sd_st_header *h,
                      sd_error *err) {
  if (hl == 0 || js[0] != '{')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: header does not start with '{'", label);
  /* Checked whole first, as jansson did, then walked in place: no tree, so
   * the cost is the header's bytes and one sd_st_tensor (and name) a tensor. */
  size_t at;
  const char *why;
  int utf8;
  if (sd_json_check(js, (size_t)hl, &at, &why, &utf8) != 0)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: header is not valid JSON at byte %zu: %s%s", label, at, why,
                   utf8 ? " (invalid UTF-8)" : "");
  sd_jcur c;
  sd_jcur_init(&c, js, (size_t)hl);
  size_t n = 0;
  sd_jcur count = c;
  sd_jcur_enter(&count);
  while (sd_jcur_more(&count)) {
    sd_jcur_skip(&count); /* the key */
    sd_jcur_peek(&count);
    count.p++;            /* its ':' */
    sd_jcur_skip(&count);
    n++;
  }
  h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
  if (!h->tensors) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  sd_nameidx names;
  sd_nameidx_init(&names);
  int rc = sd_nameidx_reserve(&names, n, tensor_name, h) ? sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label) : 0;
  int seen_meta = 0;
  sd_jcur_enter(&c);
  while (!rc && sd_jcur_more(&c)) {
    size_t kat = sd_jcur_at(&c);
    char *k = sd_jcur_key(&c);
    if (!k) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    if (!strcmp(k, "__metadata__")) {
      rc = seen_meta++ ? dup_key(label, kat, k, err) : parse_metadata(label, &c, h, err);
      free(k);
      continue;
    }
    if (sd_nameidx_find(&names, k, tensor_name, h) != SD_NAMEIDX_NONE) {
      rc = dup_key(label, kat, k, err);
      free(k);
      break;
    }
    sd_st_tensor *t = &h->tensors[h->ntensors];
    rc = parse_tensor(label, k, &c, t, err);
    if (rc || sd_nameidx_insert(&names, k, (uint32_t)h->ntensors, tensor_name, h) != 0) {
      free(k);
      if (!rc) rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    t->name = k;
    h->ntensors++;
    h->total_parameters += t->numel;
  }
  sd_nameidx_free(&names);
  if (rc) return rc;
  if (h->ntensors) qsort(h->tensors, h->ntensors, sizeof *h->tensors, cmp_offsets);
  return check_layout(label, h, err);
}

int sd_st_parse(const char *label, const void *buf, size_t len, uint64_t file_size,
                sd_st_header *h, sd_error *err) {
  memset(h, 0, sizeof *h);
  if (!label) label = "<buffer>";
  uint64_t hl;
  int rc = check_prefix(label, buf, len, file_size, &hl, err);
  if (rc) return rc;
  if (len - 8 < hl)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: only %zu of the %" PRIu64 " header bytes given", label, len - 8, hl);
  h->header_len = hl;
  h->data_start = 8 + hl;
  h->file_size = file_size;
  h->data_size = file_size - h->data_start;
  rc = parse_json(label, (const char *)buf + 8, hl, h, err);
  if (rc) sd_st_header_free(h);
  return rc;
}

int sd_st_meta_crc(const char *label, const sd_st_header *h, int *has, uint32_t *crc,
                   sd_error *err) {
  *has = 0;
  *crc = 0;
  for (size_t i = 0; i < h->nmeta; i++) {
    if (strcmp(h->meta[i].key, SD_CHECKSUM_KEY) != 0) continue;
    if (sd_crc32c_parse(h->meta[i].value, crc) != 0) {
      char vb[SD_MSGNAME_MAX];
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: __metadata__ '" SD_CHECKSUM_KEY "' is '%s', not %d hex digits", label,
                     SHOW(vb, h->meta[i].value), SD_CHECKSUM_HEX);
    }
    *has = 1;
    return 0;
  }
  return 0;
}

const sd_st_tensor *sd_st_find(const sd_st_header *h, const char *name) {
  for (size_t i = 0; i < h->ntensors; i++)
    if (strcmp(h->tensors[i].name, name) == 0) return &h->tensors[i];
  return NULL;
}

/* ------------------------------------------------------------------------ *
 * Files
 * ------------------------------------------------------------------------ */

static int read_full(int fd, void *buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -ENODATA; /* the file shrank under us */
    done += (size_t)r;
  }
  return 0;
}

static const char *kind_of(mode_t m) {
  return S_ISFIFO(m) ? "a fifo" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device" :
         S_ISBLK(m) ? "a block device" : S_ISDIR(m) ? "a folder" : "not a file";
}

int sd_open_regular(int dirfd, const char *path, const char *label, struct stat *st, sd_error *err) {
  if (!label) label = path;
  int fd = openat(dirfd, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    /* A socket cannot be opened at all (ENXIO): still the same refusal. */
    if (fstatat(dirfd, path, st, 0) == 0 && !S_ISREG(st->st_mode)) {
      sd_fail(err, SHARDD_E_FORMAT, "%s: not a regular file (%s)", label, kind_of(st->st_mode));
      return -1;
    }
    sd_fail(err, SHARDD_E_IO, "%s: cannot open: %s", label, strerror(e));
    return -1;
  }
  if (fstat(fd, st) != 0) {
    sd_fail(err, SHARDD_E_IO, "%s: cannot stat: %s", label, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    sd_fail(err, SHARDD_E_FORMAT, "%s: not a regular file (%s)", label, kind_of(st->st_mode));
    close(fd);
    return -1;
  }
  return fd;
}

int sd_st_read_fileat(int dirfd, const char *path, const char *label, sd_st_header *h,
                      sd_error *err) {
  memset(h, 0, sizeof *h);
  if (!label) label = path;
  struct stat st;
  int fd = sd_open_regular(dirfd, path, label, &st, err);
  if (fd < 0) return err->code;
  int rc = 0;
  char *buf = NULL;
  uint64_t size = (uint64_t)st.st_size;
  unsigned char pre[8];
  size_t npre = size < 8 ? (size_t)size : 8;
  int r = read_full(fd, pre, npre, 0);
  if (r) {
    rc = sd_fail(err, SHARDD_E_IO, "%s: cannot read: %s", label, strerror(-r));
    goto out;
  }
  uint64_t hl;
  if ((rc = check_prefix(label, pre, npre, size, &hl, err)) != 0) goto out;
  buf = malloc(8 + hl);
  if (!buf) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory for a %" PRIu64 "-byte header",
                 label, hl);
    goto out;
  }
  memcpy(buf, pre, 8);
  if ((r = read_full(fd, buf + 8, hl, 8)) != 0) {
    rc = sd_fail(err, SHARDD_E_IO, "%s: cannot read the header: %s", label, strerror(-r));
    goto out;
  }
  rc = sd_st_parse(label, buf, 8 + hl, size, h, err);
out:
  free(buf);
  close(fd);
  return rc;
}

int sd_st_read_file(const char *path, sd_st_header *h, sd_error *err) {
  return sd_st_read_fileat(AT_FDCWD, path, path, h, err);
}
