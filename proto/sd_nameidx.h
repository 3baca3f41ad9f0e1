/* A name -> index hash table over an array the caller owns: open addressing, linear probing, no copies of names. */
#ifndef SD_NAMEIDX_H
#define SD_NAMEIDX_H

#include <stddef.h>
#include <stdint.h>

#include "sd_grow.h"

#define SD_NAMEIDX_NONE UINT32_MAX

/* The table stores indices only; the names stay in the caller's array and are
 * read back through this callback, so a lookup allocates nothing and the
 * caller's array may be reallocated freely. ctx is the array's owner. */
typedef const char *sd_nameidx_name_fn(const void *ctx, uint32_t idx);

/* All zero is a valid empty table. A slot keeps 32 bits of its name's hash beside the index, so a
 * probe reads the caller's name only when those agree, and growing reads no name at all: with
 * 100,000 tensors those reads of names scattered in memory were a tenth of a save's CPU. */
typedef struct {
  uint64_t *slots;  /* hash tag << 32 | index + 1; 0 empty */
  size_t cap;       /* 0 or a power of two, at least twice n */
  size_t n;         /* entries */
} sd_nameidx;

void sd_nameidx_init(sd_nameidx *ix);
void sd_nameidx_free(sd_nameidx *ix);

/* FNV-1a steps with the 64-bit prime, from the basis 1469598103934665603 that
 * save_request.c and cluster_plan.c always used (the standard basis has one more
 * digit; any basis hashes as well). The home slot is hash & (cap - 1). */
uint64_t sd_nameidx_hash(const char *name);

/* The index stored for name, or SD_NAMEIDX_NONE. */
uint32_t sd_nameidx_find(const sd_nameidx *ix, const char *name, sd_nameidx_name_fn *name_of, const void *ctx);

/* Room for `want` entries without another rehash. 0, or -1 out of memory
 * (the table unchanged). */
int sd_nameidx_reserve(sd_nameidx *ix, size_t want, sd_nameidx_name_fn *name_of, const void *ctx);

/* Maps name (which must not be present yet) to idx, growing as needed; only
 * the entries already in the table are read through name_of, so idx need not
 * be in the caller's array yet. 0, or -1 out of memory or idx too large (the
 * table unchanged). */
int sd_nameidx_insert(sd_nameidx *ix, const char *name, uint32_t idx, sd_nameidx_name_fn *name_of,
                      const void *ctx);

/* The one table of named records, for an owner that keeps pointers to records keyed by their `name` member:
 * owner->arr (n of them, room for cap, in order of first add) indexed by owner->idx. Defines, for the file
 * that names it, fn##_name (the callback above), fn##_find (the record or NULL) and fn##_add (0, or -1 out
 * of memory with neither the array nor the index holding the record; the array starts at first). */
#define SD_NAMED_TABLE(fn, owner_t, rec_t, arr, n, cap, idx, first)                                        \
  static inline const char *fn##_name(const void *ctx, uint32_t i) {                                     \
    return ((const owner_t *)ctx)->arr[i]->name;                                                         \
  }                                                                                                      \
  static inline rec_t *fn##_find(const owner_t *o, const char *name) {                                   \
    uint32_t i = sd_nameidx_find(&o->idx, name, fn##_name, o);                                           \
    return i == SD_NAMEIDX_NONE ? NULL : o->arr[i];                                                      \
  }                                                                                                      \
  static inline int fn##_add(owner_t *o, rec_t *r) {                                                     \
    if (SD_GROW(o->arr, o->cap, o->n + 1, first)) return -1;                                             \
    if (sd_nameidx_insert(&o->idx, r->name, (uint32_t)o->n, fn##_name, o) != 0) return -1;               \
    o->arr[o->n++] = r;                                                                                  \
    return 0;                                                                                            \
  }

#endif
