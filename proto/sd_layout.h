/* Internal helpers shared by the layout core's files (tensor, plan, header, index, coverage). */
#ifndef SD_LAYOUT_H
#define SD_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "sd_format.h"
#include "sd_utf8.h"

/* ------------------------------------------------------------------------ *
 * Strings
 * ------------------------------------------------------------------------ */
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
/* The same, working in the caller's scratch memory when it holds at least
 * sd_sort_keys_scratch(n) bytes (8-byte aligned); otherwise it allocates. */
int sd_sort_keys_in(sd_skey *v, size_t n, void *scratch, size_t scratch_size);
size_t sd_sort_keys_scratch(size_t n);

/* A byte string whose memcmp order is sd_natural_cmp's order (for names
 * without NUL bytes); out needs sd_natural_key_max(len) bytes. */
size_t sd_natural_key_max(size_t len);
size_t sd_natural_key(const char *name, size_t len, unsigned char *out);

/* ------------------------------------------------------------------------ *
 * Large arrays (a million tensors means hundreds of MB of scratch and output):
 * sd_big_alloc asks for transparent huge pages from SD_BIG_ALLOC_MIN bytes
 * up, because first-touch page faults, not the work on the bytes, dominate
 * such sizes (worst in VMs). Same contract as malloc: release with free().
 * ------------------------------------------------------------------------ */
#define SD_BIG_ALLOC_MIN (4u << 20)
void *sd_big_alloc(size_t n);

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

/* The same encoders writing at o (no bounds checks; each returns the end).
 * A quoted string takes at most SD_JSON_STR_MAX(n) bytes; a name that
 * sd_name_check accepts takes exactly n + 2 + its count of '"' and '\\'
 * in the serde_json form. */
#define SD_JSON_STR_MAX(n) (6 * (size_t)(n) + 2)
char *sd_json_str_put(char *o, const char *s, size_t n);
char *sd_json_str_ascii_put(char *o, const char *s, size_t n);
#define SD_U64_DIGITS_MAX 20
unsigned sd_u64_digits(uint64_t v);
char *sd_put_u64(char *o, uint64_t v);

/* ------------------------------------------------------------------------ *
 * Header encoding (header.c), used by the planner.
 * ------------------------------------------------------------------------ */
/* Compact JSON fragment `{"__metadata__":{"format":"pt",...}` (no closing
 * brace for the outer object): caller pairs sorted by key, "format" forced
 * to "pt", duplicate keys and invalid UTF-8 refused. */
int sd_header_meta_json(const sd_kv *kv, size_t n, sd_buf *out, sd_error *err);
/* The same with shardd's checksum pair among them (its value the
 * placeholder "00000000"): *sum_at is where in out its hex digits start. A
 * caller's pair of that key is dropped either way, as "format" is forced. */
int sd_header_meta_json_sum(const sd_kv *kv, size_t n, sd_buf *out, size_t *sum_at, sd_error *err);

/* Upper bounds for sizing the block all headers are encoded into: one
 * tensor's entry (given its name's escaped, quoted length), and a file's
 * length prefix, metadata, closing brace and padding. */
size_t sd_header_entry_max(const sd_tensor *t, size_t escaped_name_len);
size_t sd_header_file_max(size_t meta_len);

/* Encodes f's header at out (room for sd_header_file_max plus each of its
 * tensors' sd_header_entry_max) and sets f->header = out, header_size,
 * data_size and file_size. f->tensors is already in the reference writer's
 * order (descending element size, then name bytes); loc[] gets contiguous
 * data offsets in that order. nbytes[i] and name_len[i] belong to input
 * tensor i and are already validated. */
int sd_header_encode(sd_plan_file *f, uint32_t file_no, const sd_tensor *tensors,
                     const uint64_t *nbytes, const uint32_t *name_len, const char *meta_json,
                     size_t meta_len, char *out, sd_plan_loc *loc, sd_error *err);

#endif
