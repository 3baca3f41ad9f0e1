/* base64 codec: RFC 4648 vectors, round trips of every length, and strict refusal of malformed input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_base64.h"

/* ---- RFC 4648 section 10 test vectors ---- */

static const char *const vec_plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
static const char *const vec_b64[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};

Test(base64, rfc4648_encode) {
  for (size_t i = 0; i < sizeof vec_plain / sizeof *vec_plain; i++) {
    size_t n = strlen(vec_plain[i]);
    char buf[32];
    memset(buf, 'X', sizeof buf);
    cr_assert_eq(sd_b64_encoded_len(n), strlen(vec_b64[i]));
    size_t w = sd_b64_encode(vec_plain[i], n, buf);
    cr_assert_eq(w, strlen(vec_b64[i]));
    cr_assert_str_eq(buf, vec_b64[i]);
  }
}

Test(base64, rfc4648_decode) {
  for (size_t i = 0; i < sizeof vec_plain / sizeof *vec_plain; i++) {
    uint8_t *out = NULL;
    size_t outlen = 99;
    sd_error err = {0};
    cr_assert_eq(sd_b64_decode(vec_b64[i], strlen(vec_b64[i]), &out, &outlen, &err), 0, "%s: %s",
                 vec_b64[i], err.msg);
    cr_assert_not_null(out);
    cr_assert_eq(outlen, strlen(vec_plain[i]));
    cr_assert(memcmp(out, vec_plain[i], outlen) == 0);
    free(out);
  }
}

Test(base64, decode_reads_only_len_chars) {
  uint8_t *out;
  size_t outlen;
  /* Trailing garbage beyond len must be ignored: callers pass JSON string lengths. */
  cr_assert_eq(sd_b64_decode("Zm9v!!!!", 4, &out, &outlen, NULL), 0);
  cr_assert_eq(outlen, 3);
  cr_assert(memcmp(out, "foo", 3) == 0);
  free(out);
}

Test(base64, round_trip_all_lengths_and_bytes) {
  uint8_t src[300];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 151 + 7);
  for (size_t i = 0; i < 256; i++) src[i] = (uint8_t)i; /* every byte value appears */
  char enc[sizeof src / 3 * 4 + 8];
  for (size_t n = 0; n <= sizeof src; n++) {
    size_t w = sd_b64_encode(src, n, enc);
    cr_assert_eq(w, sd_b64_encoded_len(n));
    cr_assert_eq(enc[w], '\0');
    cr_assert_eq(strlen(enc), w);
    uint8_t *out;
    size_t outlen;
    sd_error err = {0};
    cr_assert_eq(sd_b64_decode(enc, w, &out, &outlen, &err), 0, "n=%zu: %s", n, err.msg);
    cr_assert_eq(outlen, n);
    cr_assert(memcmp(out, src, n) == 0, "n=%zu", n);
    free(out);
  }
}

Test(base64, encoded_len_overflow) {
  cr_assert_eq(sd_b64_encoded_len(SIZE_MAX), SIZE_MAX);
  cr_assert_eq(sd_b64_encoded_len(3), 4);
  cr_assert_eq(sd_b64_encoded_len(4), 8);
}

/* ---- strict refusal ---- */

static void expect_bad(const char *s, const char *needle) {
  uint8_t *out = (uint8_t *)1;
  size_t outlen = 7;
  sd_error err = {0};
  int rc = sd_b64_decode(s, strlen(s), &out, &outlen, &err);
  cr_assert_eq(rc, SHARDD_E_INVALID_ARGUMENT, "'%s' accepted", s);
  cr_assert_eq(err.code, SHARDD_E_INVALID_ARGUMENT);
  cr_assert_null(out, "'%s': out not reset", s);
  cr_assert_eq(outlen, 0);
  cr_assert(strstr(err.msg, needle) != NULL, "'%s': message '%s' lacks '%s'", s, err.msg, needle);
}

Test(base64, rejects_bad_length) {
  expect_bad("Zm9", "length 3 is not a multiple of 4");
  expect_bad("Zg", "not a multiple of 4");
  expect_bad("Zm9vY", "length 5");
  expect_bad("Zg=", "multiple of 4");
}

Test(base64, rejects_bad_characters) {
  expect_bad("Zm9v!mFy", "invalid character '!' at position 4");
  expect_bad("Zm-v", "invalid character '-' at position 2"); /* URL-safe alphabet is not RFC 4648 base64 */
  expect_bad("Zm_v", "'_' at position 2");
  expect_bad("Zm9 ", "' ' at position 3");
  expect_bad("Zm9v\nYmFy", "multiple of 4");
  expect_bad("Zm9v\nYmF", "invalid byte 0x0a at position 4");
  expect_bad("Zm\xc3\xa9", "invalid byte 0xc3 at position 2");
  expect_bad("Z\x01==", "invalid byte 0x01 at position 1");
}

Test(base64, rejects_nul_inside_len) {
  uint8_t *out;
  size_t outlen;
  sd_error err = {0};
  cr_assert_eq(sd_b64_decode("Zm\0v", 4, &out, &outlen, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "base64: invalid byte 0x00 at position 2");
}

Test(base64, rejects_misplaced_padding) {
  expect_bad("Zg==Zm9v", "padding '=' at position 2 is not at the end");
  expect_bad("Z===", "padding '=' at position 1");
  expect_bad("====", "padding '=' at position 0");
  expect_bad("Zm=v", "padding '=' at position 2");
  expect_bad("=m9v", "padding '=' at position 0");
}

Test(base64, rejects_non_canonical_padding_bits) {
  /* "Zh==" and "Zm9=" decode to "f"/"fo" only if leftover bits are ignored. */
  expect_bad("Zh==", "non-zero padding bits");
  expect_bad("Zm9=", "non-zero padding bits");
  expect_bad("Zm9vZm9=", "at position 4");
}

Test(base64, null_err_is_allowed) {
  uint8_t *out;
  size_t outlen;
  cr_assert_eq(sd_b64_decode("@@@@", 4, &out, &outlen, NULL), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_null(out);
}
