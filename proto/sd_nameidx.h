/* A name -> index hash table over an array the caller owns: open addressing, linear probing, no copies of names. */
#ifndef SD_NAMEIDX_H
#define SD_NAMEIDX_H

#include <stddef.h>
#include <stdint.h>

#define SD_NAMEIDX_NONE UINT32_MAX

/* The table stores indices only; the names stay in the caller's array and are
 * read back through this callback, so a lookup allocates nothing and the
 * caller's array may be reallocated freely. ctx is the array's owner. */
typedef const char *sd_nameidx_name_fn(const void *ctx, uint32_t idx);

/* All zero is a valid empty table. */
typedef struct {
  uint32_t *slots;  /* index + 1, 0 empty */
  size_t cap;       /* 0 or a power of two, at least twice n */
  size_t n;         /* entries */
} sd_nameidx;

void sd_nameidx_init(sd_nameidx *ix);
void sd_nameidx_free(sd_nameidx *ix);

/* FNV-1a steps with the 64-bit prime, from the basis 1469598103934665603 that
 * save.c and cluster_plan.c always used (the standard basis has one more
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

#endif
