/* CRC-32C from ISA-L, and the algebra that lets pieces written out of order (staged chunks, zero-copy spans, other nodes' bytes) add up to the CRC of the whole data section. */
#include <isa-l/crc.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "sd_checksum.h"

/* ISA-L's crc32_iscsi runs the reflected CRC-32C register from init over
 * the bytes, with no final inversion; the standard CRC starts from and
 * ends with an inverted register. With init 0 it is the linear part alone. */
static uint32_t reg_run(uint32_t reg, const uint8_t *p, size_t n) {
  while (n > 0) {
    int k = n > (size_t)(INT_MAX & ~4095) ? (INT_MAX & ~4095) : (int)n;
    reg = crc32_iscsi((unsigned char *)p, k, reg);
    p += k;
    n -= (size_t)k;
  }
  return reg;
}

uint32_t sd_crc32c(uint32_t crc, const void *p, size_t n) {
  return ~reg_run(~crc, p, n);
}

/* ------------------------------------------------------------------------ *
 * Moving a register past n zero bytes is multiplying its polynomial by
 * x^(8n) modulo the CRC's polynomial. In the reflected form bit 31 is x^0.
 * ------------------------------------------------------------------------ */
#define POLY_REFLECTED 0x82f63b78u

static uint32_t mulmod(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m; m >>= 1) {
    if (a & m) p ^= b;
    b = (b >> 1) ^ (b & 1 ? POLY_REFLECTED : 0);
  }
  return p;
}

/* Multiplying by the fixed x^(2^k) is linear in the other factor: four
 * byte tables make it four lookups. Bytes are counted, so k starts at 3
 * (x^8, one byte) and 64 powers cover any 64-bit count. */
#define POWERS 64
static pthread_once_t pow_once = PTHREAD_ONCE_INIT;
static uint32_t pow_store[POWERS][4][256];

static void pow_init(void) {
  uint32_t x = 1u << 23; /* x^8 */
  for (int k = 0; k < POWERS; k++) {
    for (int byte = 0; byte < 4; byte++)
      for (uint32_t v = 0; v < 256; v++) pow_store[k][byte][v] = mulmod(x, v << (8 * byte));
    x = mulmod(x, x);
  }
}

static uint32_t mul_pow(int k, uint32_t r) {
  uint32_t(*t)[256] = pow_store[k];
  return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24];
}

uint32_t sd_crc32c_shift(uint32_t share, uint64_t n) {
  if (!share || !n) return share;
  pthread_once(&pow_once, pow_init);
  for (int k = 0; n; k++, n >>= 1)
    if (n & 1) share = mul_pow(k, share);
  return share;
}

uint32_t sd_crc32c_piece(const void *p, size_t n, uint64_t after) {
  return sd_crc32c_shift(reg_run(0, p, n), after);
}

uint32_t sd_crc32c_run(uint32_t reg, const void *p, size_t n) {
  return reg_run(reg, p, n);
}

uint32_t sd_crc32c_final(uint32_t shares, uint64_t len) {
  return shares ^ sd_crc32c_shift(0xffffffffu, len) ^ 0xffffffffu;
}

void sd_crc32c_hex(uint32_t crc, char out[SD_CHECKSUM_HEX + 1]) {
  snprintf(out, SD_CHECKSUM_HEX + 1, "%08x", crc);
}

int sd_crc32c_parse(const char *s, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < SD_CHECKSUM_HEX; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v << 4 | (uint32_t)d;
  }
  if (s[SD_CHECKSUM_HEX]) return -1;
  *out = v;
  return 0;
}
