/* One growable array: a caller's pointer and capacity, doubled from a first size when more room is needed. */
#ifndef SD_GROW_H
#define SD_GROW_H

#include <stddef.h>

/* Room for need elements of elem bytes in the array whose pointer lives at *arrp, its capacity at *cap: a
 * full array doubles (from first when empty) until need fits. 0, or -1 out of memory or on an overflowing
 * size, with the array and *cap unchanged, so a caller can fail before it records anything. The pointer
 * is read and written with memcpy, so any object pointer's address may be passed. */
int sd_grow(void *arrp, size_t *cap, size_t need, size_t elem, size_t first);

/* SD_GROW(p->items, p->cap, p->n + 1, 16): arr an lvalue pointer, cap an lvalue size_t. */
#define SD_GROW(arr, cap, need, first) sd_grow(&(arr), &(cap), (need), sizeof *(arr), (first))

#endif
