/* Strict reader for one .safetensors file: checks every rule of the format before trusting a byte. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "sd_checksum.h"
#include "sd_layout.h"
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

/* A JSON integer that fits in uint64_t; jansson already refuses integers
 * beyond long long, and reals (2.0, 1e3) are not integers in the format. */
static int json_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v)) return -1;
  json_int_t i = json_integer_value(v);
  if (i < 0) return -1;
  *out = (uint64_t)i;
  return 0;
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

static int parse_metadata(const char *label, json_t *obj, sd_st_header *h, sd_error *err) {
  if (!json_is_object(obj))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: __metadata__ is not an object of strings", label);
  size_t n = json_object_size(obj);
  h->meta = calloc(n ? n : 1, sizeof *h->meta);
  if (!h->meta) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    if (!json_is_string(v)) {
      char kb[SD_MSGNAME_MAX];
      return sd_fail(err, SHARDD_E_FORMAT, "%s: __metadata__ '%s' is not a string", label,
                     SHOW(kb, k));
    }
    sd_st_meta *m = &h->meta[h->nmeta];
    m->key = strdup(k);
    m->value = strdup(json_string_value(v));
    h->nmeta++;
    if (!m->key || !m->value) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  }
  return 0;
}

static int parse_tensor(const char *label, const char *raw, json_t *obj, sd_st_tensor *t,
                        sd_error *err) {
  char name[SD_MSGNAME_MAX], kb[SD_MSGNAME_MAX];
  SHOW(name, raw);
  if (!json_is_object(obj))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s' is not an object", label, name);
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
      return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': unexpected field '%s'", label, name,
                     SHOW(kb, k));
  }
  json_t *jd = json_object_get(obj, "dtype");
  json_t *js = json_object_get(obj, "shape");
  json_t *jo = json_object_get(obj, "data_offsets");
  const char *missing = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
  if (missing)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': missing '%s'", label, name, missing);

  if (!json_is_string(jd))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': dtype is not a string", label, name);
  sd_error sub;
  sd_error_clear(&sub);
  if (sd_dtype_parse(json_string_value(jd), &t->dtype, &sub) != 0)
    return sub.msg[0] ? sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s", label, name, sub.msg)
                      : sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': unknown dtype '%s'", label,
                                name, SHOW(kb, json_string_value(jd)));

  if (!json_is_array(js))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': shape is not an array", label, name);
  if (json_array_size(js) > SD_MAX_DIMS)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': shape has %zu dimensions, over %d",
                   label, name, json_array_size(js), SD_MAX_DIMS);
  t->ndim = (uint32_t)json_array_size(js);
  for (uint32_t i = 0; i < t->ndim; i++) {
    if (json_u64(json_array_get(js, i), &t->shape[i]) != 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: tensor '%s': shape[%" PRIu32 "] is not a non-negative integer", label,
                     name, i);
  }
  char ty[SD_MAX_DIMS * 21 + 32];
  fmt_type(ty, sizeof ty, t->dtype, t->ndim, t->shape);
  if (sd_tensor_numel(raw, t->ndim, t->shape, &t->numel, &sub) != 0)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s element count overflows", label,
                   name, ty);
  unsigned esz = sd_dtype_size(t->dtype);
  if (t->numel > UINT64_MAX / esz)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s': %s byte size overflows 64 bits",
                   label, name, ty);
  uint64_t nbytes = t->numel * esz;

  if (!json_is_array(jo) || json_array_size(jo) != 2 ||
      json_u64(json_array_get(jo, 0), &t->begin) != 0 ||
      json_u64(json_array_get(jo, 1), &t->end) != 0)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets is not [begin, end] of non-negative integers",
                   label, name);
  if (t->end < t->begin)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] end before begin",
                   label, name, t->begin, t->end);
  if (t->end - t->begin != nbytes)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] but %s needs %" PRIu64
                   " bytes",
                   label, name, t->begin, t->end, ty, nbytes);
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
  json_error_t je;
  /* jansson validates UTF-8 and, with this flag, refuses a key seen twice in
   * any object; NUL bytes stay refused because JSON_ALLOW_NUL is not set. */
  json_t *root = json_loadb(js, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: header is not valid JSON at byte %d: %s%s", label,
                   je.position, je.text,
                   json_error_code(&je) == json_error_invalid_utf8 ? " (invalid UTF-8)" : "");
  int rc = 0;
  if (!json_is_object(root)) {
    rc = sd_fail(err, SHARDD_E_FORMAT, "%s: header is not a JSON object", label);
    goto out;
  }
  json_t *meta = json_object_get(root, "__metadata__");
  size_t n = json_object_size(root) - (meta ? 1 : 0);
  h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
  if (!h->tensors) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    goto out;
  }
  if (meta && (rc = parse_metadata(label, meta, h, err)) != 0) goto out;
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (v == meta) continue;
    sd_st_tensor *t = &h->tensors[h->ntensors];
    if ((rc = parse_tensor(label, k, v, t, err)) != 0) goto out;
    if (!(t->name = strdup(k))) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      goto out;
    }
    h->ntensors++;
    h->total_parameters += t->numel;
  }
  if (h->ntensors) qsort(h->tensors, h->ntensors, sizeof *h->tensors, cmp_offsets);
  rc = check_layout(label, h, err);
out:
  json_decref(root);
  return rc;
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
