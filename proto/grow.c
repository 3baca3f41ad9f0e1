/* The one growth rule for the daemon's and the client's arrays: doubling, overflow-checked, unchanged on failure. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sd_grow.h"

int sd_grow(void *arrp, size_t *cap, size_t need, size_t elem, size_t first) {
  if (need <= *cap) return 0;
  size_t ncap = *cap ? *cap : (first ? first : 1);
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2) return -1;
    ncap *= 2;
  }
  if (elem && ncap > SIZE_MAX / elem) return -1;
  void *old;
  memcpy(&old, arrp, sizeof old);
  void *p = realloc(old, ncap * elem);
  if (!p) return -1;
  memcpy(arrp, &p, sizeof p);
  *cap = ncap;
  return 0;
}
