/* Internal helpers shared by the layout core's files (tensor, plan, header, index, coverage). */
#ifndef SD_LAYOUT_H
#define SD_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "sd_format.h"

/* ------------------------------------------------------------------------ *
 * Strings
 * ------------------------------------------------------------------------ */
/* 1 when s[0..len) is valid UTF-8 (no overlongs, surrogates or code points
 * past U+10FFFF); otherwise 0 and *bad (if not NULL) is the offending byte. */
int sd_utf8_valid(const char *s, size_t len, size_t *bad);

/* Copies s into buf for use inside an error message: at most about cap-4
 * bytes, cut on a character boundary with "..." appended, and every byte that
 * is not printable valid UTF-8 replaced by '?'. Messages travel inside JSON on
 * the wire, so they must stay valid UTF-8 whatever the caller sent. */
const char *sd_msgstr(char *buf, size_t cap, const char *s, size_t len);
#define SD_MSGNAME_MAX 160

/* "[1,2,3]" (at most cap bytes, truncated with "...]"). */
const char *sd_fmt_dims(char *buf, size_t cap, uint32_t ndim, const uint64_t *v);

/* ------------------------------------------------------------------------ *
 * Sorting names fast (1M tensors): keys compared as bytes, shorter first.
 * ------------------------------------------------------------------------ */
typedef struct {
  const unsigned char *key;
  uint32_t len;
  uint32_t idx;             /* caller's payload, carried along */
} sd_skey;

/* Stable sort by key bytes (memcmp, then length): 0, SHARDD_E_NO_MEMORY, or
 * SHARDD_E_LIMIT past 2^28 keys (idx values must be below 2^28 too). */
int sd_sort_keys(sd_skey *v, size_t n);

/* A byte string whose memcmp order is sd_natural_cmp's order (for names
 * without NUL bytes); out needs sd_natural_key_max(len) bytes. */
size_t sd_natural_key_max(size_t len);
size_t sd_natural_key(const char *name, size_t len, unsigned char *out);

/* ------------------------------------------------------------------------ *
 * Growable byte buffer; a failed allocation sets oom and later appends are
 * no-ops, so builders check once at the end.
 * ------------------------------------------------------------------------ */
typedef struct {
  char *p;
  size_t len;
  size_t cap;
  int oom;
} sd_buf;

void sd_buf_reserve(sd_buf *b, size_t extra);
void sd_buf_put(sd_buf *b, const void *s, size_t n);
void sd_buf_puts(sd_buf *b, const char *s);
void sd_buf_putc(sd_buf *b, char c);
void sd_buf_put_u64(sd_buf *b, uint64_t v);
/* A JSON string with quotes, escaped the way serde_json does (UTF-8 kept). */
void sd_buf_json_str(sd_buf *b, const char *s, size_t n);
/* A JSON string escaped the way Python's json.dumps does by default
 * (ensure_ascii: everything outside ' '..'~' as lowercase \uXXXX). */
void sd_buf_json_str_ascii(sd_buf *b, const char *s, size_t n);

/* ------------------------------------------------------------------------ *
 * Header encoding (header.c), used by the planner.
 * ------------------------------------------------------------------------ */
/* Compact JSON fragment `{"__metadata__":{"format":"pt",...}` (no closing
 * brace for the outer object): caller pairs sorted by key, "format" forced
 * to "pt", duplicate keys and invalid UTF-8 refused. */
int sd_header_meta_json(const sd_kv *kv, size_t n, sd_buf *out, sd_error *err);

/* Encodes f->header / header_size / data_size / file_size for f->tensors,
 * which the planner has already put in the reference writer's order
 * (descending element size, then name bytes), and fills loc[] with
 * contiguous data offsets in that order. nbytes[i] and name_len[i] belong
 * to input tensor i and are already validated. */
int sd_header_encode(sd_plan_file *f, uint32_t file_no, const sd_tensor *tensors,
                     const uint64_t *nbytes, const uint32_t *name_len, const char *meta_json,
                     size_t meta_len, sd_plan_loc *loc, sd_error *err);

#endif
