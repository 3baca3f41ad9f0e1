/* The name -> index hash table shared by the save state machine and the cluster manifest. Pure. */
#include <stdlib.h>
#include <string.h>

#include "sd_nameidx.h"

void sd_nameidx_init(sd_nameidx *ix) { memset(ix, 0, sizeof *ix); }

void sd_nameidx_free(sd_nameidx *ix) {
  free(ix->slots);
  sd_nameidx_init(ix);
}

uint64_t sd_nameidx_hash(const char *name) {
  uint64_t h = 1469598103934665603ULL;
  while (*name) h = (h ^ (unsigned char)*name++) * 1099511628211ULL;
  return h;
}

/* The 32 bits of a name's hash kept in its slot: the low ones, so that its home slot, tag & (cap - 1),
 * is hash & (cap - 1); the bits above the mask tell apart most names of one probe run. */
static uint32_t tag_of(const char *name) { return (uint32_t)sd_nameidx_hash(name); }

/* The table is never more than half full, so every probe meets an empty slot. */
uint32_t sd_nameidx_find(const sd_nameidx *ix, const char *name, sd_nameidx_name_fn *name_of, const void *ctx) {
  if (ix->cap == 0) return SD_NAMEIDX_NONE;
  size_t mask = ix->cap - 1;
  uint32_t tag = tag_of(name);
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    uint64_t v = ix->slots[i];
    if (v == 0) return SD_NAMEIDX_NONE;
    uint32_t idx = (uint32_t)v - 1;
    if ((uint32_t)(v >> 32) == tag && strcmp(name_of(ctx, idx), name) == 0) return idx;
  }
}

static void place(uint64_t *slots, size_t cap, uint64_t v) {
  size_t i = (uint32_t)(v >> 32) & (cap - 1);
  while (slots[i]) i = (i + 1) & (cap - 1);
  slots[i] = v;
}

int sd_nameidx_reserve(sd_nameidx *ix, size_t want, sd_nameidx_name_fn *name_of, const void *ctx) {
  (void)name_of; /* the tags place every entry again */
  (void)ctx;
  if (want * 2 <= ix->cap) return 0;
  if (want > SIZE_MAX / 4 / sizeof(uint64_t)) return -1;
  size_t ncap = ix->cap ? ix->cap : 128;
  while (want * 2 > ncap) ncap *= 2;
  uint64_t *ns = calloc(ncap, sizeof *ns);
  if (!ns) return -1;
  for (size_t i = 0; i < ix->cap; i++)
    if (ix->slots[i]) place(ns, ncap, ix->slots[i]);
  free(ix->slots);
  ix->slots = ns;
  ix->cap = ncap;
  return 0;
}

int sd_nameidx_insert(sd_nameidx *ix, const char *name, uint32_t idx, sd_nameidx_name_fn *name_of,
                      const void *ctx) {
  if (idx >= SD_NAMEIDX_NONE) return -1; /* idx + 1 must fit a slot */
  if (sd_nameidx_reserve(ix, ix->n + 1, name_of, ctx) != 0) return -1;
  place(ix->slots, ix->cap, (uint64_t)tag_of(name) << 32 | ((uint64_t)idx + 1));
  ix->n++;
  return 0;
}
