/* The growable-array rule (proto/grow.c): first size, doubling, no move when there is room, unchanged on failure. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "sd_grow.h"

typedef struct {
  uint64_t a, b;
} pair;

Test(grow, starts_at_first_then_doubles) {
  pair *v = NULL;
  size_t cap = 0;
  cr_assert_eq(SD_GROW(v, cap, 1, 4), 0);
  cr_assert_not_null(v);
  cr_assert_eq(cap, 4);
  for (size_t i = 0; i < 4; i++) v[i] = (pair){i, ~i};
  cr_assert_eq(SD_GROW(v, cap, 5, 4), 0);
  cr_assert_eq(cap, 8);
  for (size_t i = 0; i < 4; i++) cr_assert(v[i].a == i && v[i].b == ~i, "element %zu kept", i);
  cr_assert_eq(SD_GROW(v, cap, 100, 4), 0, "several doublings at once");
  cr_assert_eq(cap, 128);
  free(v);
}

Test(grow, room_enough_leaves_it_alone) {
  char **v = malloc(8 * sizeof *v);
  char **was = v;
  size_t cap = 8;
  cr_assert_eq(SD_GROW(v, cap, 8, 64), 0);
  cr_assert_eq(v, was);
  cr_assert_eq(cap, 8);
  cr_assert_eq(SD_GROW(v, cap, 0, 64), 0);
  cr_assert_eq(cap, 8);
  free(v);
}

Test(grow, an_overflowing_size_fails_unchanged) {
  pair *v = NULL;
  size_t cap = 0;
  cr_assert_eq(SD_GROW(v, cap, 2, 2), 0);
  pair *was = v;
  cr_assert_eq(SD_GROW(v, cap, SIZE_MAX / sizeof *v + 1, 2), -1);
  cr_assert_eq(v, was);
  cr_assert_eq(cap, 2);
  cr_assert_eq(SD_GROW(v, cap, SIZE_MAX, 2), -1);
  cr_assert_eq(cap, 2);
  free(v);
}

Test(grow, a_first_of_zero_still_makes_room) {
  int *v = NULL;
  size_t cap = 0;
  cr_assert_eq(SD_GROW(v, cap, 3, 0), 0);
  cr_assert_geq(cap, 3);
  free(v);
}
