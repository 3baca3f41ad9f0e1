/* Shared helpers for the libFuzzer targets: an invariant check that aborts loudly, and a byte reader. */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A broken invariant must crash so libFuzzer keeps the input as a reproducer;
 * assert() would vanish under -DNDEBUG. */
#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: invariant broken: %s\n  ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* Consumes fuzzer bytes front to back; once they run out every read is 0, so
 * decoders never need to check lengths. */
typedef struct {
  const uint8_t *p;
  size_t n;
} fuzz_bytes;

static inline uint8_t fuzz_u8(fuzz_bytes *b) {
  if (!b->n) return 0;
  b->n--;
  return *b->p++;
}

static inline uint64_t fuzz_u64(fuzz_bytes *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)fuzz_u8(b) << (8 * i);
  return v;
}

#endif
