/* CRC-32C shares (proto/checksum.c): pieces in any order, with gaps and regions, add up to ISA-L's CRC of the whole message. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_checksum.h"

Test(checksum, standard_check_value_and_extension) {
  /* the catalogue's check value of CRC-32C (iSCSI) */
  cr_assert_eq(sd_crc32c(0, "123456789", 9), 0xe3069283u);
  cr_assert_eq(sd_crc32c(0, "", 0), 0);
  cr_assert_eq(sd_crc32c(sd_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* A message of random bytes with holes (zeros), cut into random pieces
 * whose shares are added in a random order. */
Test(checksum, pieces_in_any_order_with_gaps_equal_the_whole) {
  for (int round = 0; round < 200; round++) {
    size_t len = (size_t)(next() % 70000);
    uint8_t *m = calloc(len + 1, 1);
    size_t cuts[64], ncuts = 0;
    for (size_t at = 0; at < len && ncuts < 63;) {
      cuts[ncuts++] = at;
      at += 1 + (size_t)(next() % (round % 2 ? 9000 : 64));
    }
    cuts[ncuts] = len;
    uint32_t shares = 0;
    size_t order[64];
    for (size_t i = 0; i < ncuts; i++) order[i] = i;
    for (size_t i = ncuts; i > 1; i--) {
      size_t j = (size_t)(next() % i), t = order[i - 1];
      order[i - 1] = order[j], order[j] = t;
    }
    for (size_t k = 0; k < ncuts; k++) {
      size_t i = order[k], a = cuts[i], b = cuts[i + 1] < len ? cuts[i + 1] : len;
      if (a >= b || next() % 4 == 0) continue; /* a hole: zeros, no share */
      for (size_t x = a; x < b; x++) m[x] = (uint8_t)(next() | 1);
      shares ^= sd_crc32c_piece(m + a, b - a, len - b);
    }
    cr_assert_eq(sd_crc32c_final(shares, len), sd_crc32c(0, m, len), "round %d, %zu bytes", round, len);
    free(m);
  }
}

Test(checksum, a_piece_read_in_parts_and_a_region_moved_to_its_file) {
  uint8_t m[10000];
  for (size_t i = 0; i < sizeof m; i++) m[i] = (uint8_t)next();
  /* region [3000, 7000) of the file: its share against its own end, then moved */
  uint32_t reg = sd_crc32c_run(sd_crc32c_run(0, m + 3000, 1234), m + 4234, 7000 - 4234);
  uint32_t region = sd_crc32c_shift(reg, 0);
  uint32_t file = sd_crc32c_shift(region, sizeof m - 7000);
  file ^= sd_crc32c_piece(m, 3000, sizeof m - 3000) ^ sd_crc32c_piece(m + 7000, sizeof m - 7000, 0);
  cr_assert_eq(sd_crc32c_final(file, sizeof m), sd_crc32c(0, m, sizeof m));
  /* a shift of a shift is one shift */
  cr_assert_eq(sd_crc32c_shift(sd_crc32c_shift(0x12345678u, 1u << 20), 3), sd_crc32c_shift(0x12345678u, (1u << 20) + 3));
}

Test(checksum, long_runs_of_zeros) {
  /* 5 GiB of zeros then "123456789": only the shift of the initial register sees the zeros */
  uint64_t zeros = 5ull << 30;
  uint32_t shares = sd_crc32c_piece("123456789", 9, 0);
  uint32_t got = sd_crc32c_final(shares, zeros + 9);
  /* the same by extension: a zero region's CRC, computed a mebibyte at a time */
  uint8_t *z = calloc(1 << 20, 1);
  uint32_t want = 0;
  for (uint64_t i = 0; i < zeros >> 20; i++) want = sd_crc32c(want, z, 1 << 20);
  want = sd_crc32c(want, "123456789", 9);
  free(z);
  cr_assert_eq(got, want);
}

Test(checksum, hex_round_trip_and_refusals) {
  char h[SD_CHECKSUM_HEX + 1];
  sd_crc32c_hex(0xe3069283u, h);
  cr_assert_str_eq(h, "e3069283");
  sd_crc32c_hex(0x1u, h);
  cr_assert_str_eq(h, "00000001");
  uint32_t v = 0;
  cr_assert_eq(sd_crc32c_parse("E3069283", &v), 0);
  cr_assert_eq(v, 0xe3069283u);
  cr_assert_eq(sd_crc32c_parse("e306928", &v), -1);
  cr_assert_eq(sd_crc32c_parse("e30692831", &v), -1);
  cr_assert_eq(sd_crc32c_parse("e306928g", &v), -1);
  cr_assert_eq(sd_crc32c_parse("", &v), -1);
}
