/* Deterministic synthetic tensor bytes: any rank or test recomputes a global tensor's content from its name. */
#ifndef SHARDD_EXAMPLES_SYNTH_H
#define SHARDD_EXAMPLES_SYNTH_H

#include <stddef.h>
#include <stdint.h>

/* The byte at global (row-major, whole-tensor) byte offset i of a tensor is
 *
 *   key  = fnv1a64(name) ^ (seed * 0x9E3779B97F4A7C15)
 *   byte = (splitmix64(key ^ (i / 8)) >> (8 * (i % 8))) & 0xFF
 *
 * so a slice's bytes depend only on where they sit in the global tensor, and
 * the checkpoint on disk can be checked without keeping what the ranks sent.
 * One mix per 8 bytes keeps generation far cheaper than the copy it feeds. */

static inline uint64_t sd_synth_fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}

static inline uint64_t sd_synth_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t sd_synth_key(const char *name, uint64_t seed) {
  return sd_synth_fnv1a(name) ^ (seed * 0x9E3779B97F4A7C15ull);
}

static inline uint8_t sd_synth_byte(uint64_t key, uint64_t i) {
  return (uint8_t)(sd_synth_mix(key ^ (i >> 3)) >> (8 * (i & 7)));
}

/* Writes n bytes starting at global byte offset `first` into out. */
static inline void sd_synth_fill(uint64_t key, uint64_t first, size_t n, uint8_t *out) {
  size_t k = 0;
  while (k < n && ((first + k) & 7) != 0) {
    out[k] = sd_synth_byte(key, first + k);
    k++;
  }
  for (; k + 8 <= n; k += 8) {
    uint64_t w = sd_synth_mix(key ^ ((first + k) >> 3));
    for (unsigned b = 0; b < 8; b++) out[k + b] = (uint8_t)(w >> (8 * b));
  }
  for (; k < n; k++) out[k] = sd_synth_byte(key, first + k);
}

/* Fills the packed row-major bytes of the box (start, count) of a tensor of
 * the given shape and element size; one run per innermost row. */
static inline void sd_synth_fill_box(uint64_t key, int ndim, const uint64_t *shape,
                                     const uint64_t *start, const uint64_t *count,
                                     unsigned elem_size, uint8_t *out) {
  if (ndim == 0) {
    sd_synth_fill(key, 0, elem_size, out);
    return;
  }
  uint64_t rows = 1;
  for (int d = 0; d < ndim - 1; d++) rows *= count[d];
  uint64_t run = count[ndim - 1] * elem_size;
  if (rows == 0 || run == 0) return;
  uint64_t idx[32] = {0}; /* position within the box, outer dimensions */
  for (uint64_t r = 0; r < rows; r++) {
    uint64_t elem = 0; /* global element index of the row's first element */
    for (int d = 0; d < ndim; d++) {
      uint64_t pos = start[d] + (d < ndim - 1 ? idx[d] : 0);
      elem = elem * shape[d] + pos;
    }
    sd_synth_fill(key, elem * elem_size, (size_t)run, out + r * run);
    for (int d = ndim - 2; d >= 0; d--) {
      if (++idx[d] < count[d]) break;
      idx[d] = 0;
    }
  }
}

#endif
