/* Tensor names (UTF-8, controls, limits), element and byte counts with overflow checks, natural name order. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

/* ------------------------------------------------------------------------ *
 * Names
 * ------------------------------------------------------------------------ */
static int check(const char *s, size_t len, sd_error *err) { return sd_name_check(s, len, err); }
#define CHECK_OK(lit) cr_assert_eq(check(lit, sizeof(lit) - 1, NULL), 0, "%s", #lit)
#define CHECK_BAD(lit) \
  cr_assert_eq(check(lit, sizeof(lit) - 1, NULL), SHARDD_E_INVALID_ARGUMENT, "%s", #lit)

Test(name, accepts_ordinary_and_unicode_names) {
  CHECK_OK("a");
  CHECK_OK("model.layers.0.self_attn.q_proj.weight");
  CHECK_OK("\xc3\xa9t\xc3\xa9");             /* été */
  CHECK_OK("\xe6\x97\xa5\xe6\x9c\xac");      /* 日本 */
  CHECK_OK("\xf0\x9f\x98\x80");              /* U+1F600 */
  CHECK_OK("\xf4\x8f\xbf\xbf");              /* U+10FFFF, the last code point */
  CHECK_OK("\xed\x9f\xbf");                  /* U+D7FF, just below the surrogates */
  CHECK_OK("\xee\x80\x80");                  /* U+E000, just above */
  CHECK_OK("\xe0\xa0\x80");                  /* U+0800, shortest 3-byte form */
  CHECK_OK("\xc2\x80");                      /* U+0080 */
  CHECK_OK("__metadata__x");
  CHECK_OK("_metadata__");
  CHECK_OK(" spaces are fine ");
}

Test(name, refuses_malformed_utf8) {
  CHECK_BAD("\xc0\x80");          /* overlong NUL */
  CHECK_BAD("\xc1\xbf");          /* overlong */
  CHECK_BAD("\xe0\x80\x80");      /* overlong 3-byte */
  CHECK_BAD("\xe0\x9f\xbf");      /* overlong 3-byte */
  CHECK_BAD("\xf0\x80\x80\x80");  /* overlong 4-byte */
  CHECK_BAD("\xf0\x8f\xbf\xbf");  /* overlong 4-byte */
  CHECK_BAD("\xed\xa0\x80");      /* U+D800 surrogate */
  CHECK_BAD("\xed\xbf\xbf");      /* U+DFFF surrogate */
  CHECK_BAD("\xf4\x90\x80\x80");  /* U+110000 */
  CHECK_BAD("\xf5\x80\x80\x80");
  CHECK_BAD("\xff");
  CHECK_BAD("\xfe");
  CHECK_BAD("a\xe2\x82");         /* truncated */
  CHECK_BAD("\x80");              /* stray continuation */
  CHECK_BAD("ab\xc3");
  CHECK_BAD("\xc3\x28");
}

Test(name, refuses_controls_nul_and_reserved) {
  CHECK_BAD("a\nb");
  CHECK_BAD("\x1f");
  CHECK_BAD("tab\there");
  CHECK_BAD("del\x7f");
  CHECK_BAD("a\0b");
  CHECK_BAD("__metadata__");
  sd_error err = {0};
  cr_assert_eq(check("a\0b", 3, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor name 'a' contains a NUL byte at byte 1");
  cr_assert_eq(check("w.\x01", 3, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor name 'w.' contains control character 0x01 at byte 2");
  cr_assert_eq(check("ok.\xed\xa0\x80", 6, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor name 'ok.' is not valid UTF-8 at byte 3");
  cr_assert_eq(check("__metadata__", 12, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "reserved"), "%s", err.msg);
  cr_assert_eq(check(NULL, 0, &err), SHARDD_E_INVALID_ARGUMENT);
}

Test(name, length_limits) {
  char buf[SD_NAME_MAX + 2];
  memset(buf, 'n', sizeof buf);
  sd_error err = {0};
  cr_assert_eq(check(buf, 0, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor name is empty");
  cr_assert_eq(check(buf, SD_NAME_MAX, &err), 0);
  cr_assert_eq(check(buf, SD_NAME_MAX + 1, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "1025 bytes, over the 1024-byte limit"), "%s", err.msg);
  cr_assert(strstr(err.msg, "...'"), "the name is abbreviated: %s", err.msg);
}

/* Independent decoder: bit patterns, then range rules. */
static int ref_utf8(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    size_t n;
    uint32_t cp;
    if ((c & 0x80) == 0) { n = 1; cp = c; }
    else if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
    else return 0;
    if (i + n > len) return 0;
    for (size_t k = 1; k < n; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += n;
  }
  return 1;
}

Test(name, utf8_validator_matches_reference_exhaustively_up_to_3_bytes) {
  unsigned char s[4];
  for (unsigned a = 0; a < 256; a++) {
    s[0] = (unsigned char)a;
    cr_assert_eq(sd_utf8_valid((char *)s, 1, NULL), ref_utf8(s, 1), "%02x", a);
    for (unsigned b = 0; b < 256; b++) {
      s[1] = (unsigned char)b;
      cr_assert_eq(sd_utf8_valid((char *)s, 2, NULL), ref_utf8(s, 2), "%02x %02x", a, b);
      if (a < 0xC0) continue; /* a stray lead or ASCII: 3-byte cases reduce to shorter ones */
      for (unsigned c = 0; c < 256; c++) {
        s[2] = (unsigned char)c;
        if (sd_utf8_valid((char *)s, 3, NULL) != ref_utf8(s, 3))
          cr_assert_fail("%02x %02x %02x", a, b, c);
      }
    }
  }
}

Test(name, utf8_validator_matches_reference_on_random_4_byte_strings) {
  srand(7);
  unsigned char s[8];
  for (int it = 0; it < 2000000; it++) {
    size_t len = 1 + (size_t)(rand() % 8);
    for (size_t i = 0; i < len; i++) {
      /* Bias towards lead and continuation bytes so long sequences occur. */
      int r = rand() % 4;
      s[i] = (unsigned char)(r == 0 ? 0xF0 + rand() % 16 : r == 1 ? 0x80 + rand() % 64 : rand() % 256);
    }
    size_t bad = 99;
    int got = sd_utf8_valid((char *)s, len, &bad);
    if (got != ref_utf8(s, len)) cr_assert_fail("random case %d", it);
    if (!got) cr_assert(bad < len && ref_utf8(s, bad), "prefix before the bad byte is valid");
  }
}

Test(name, message_helper_keeps_messages_valid) {
  char buf[16];
  sd_msgstr(buf, sizeof buf, "a\x01\xff\xc3\xa9z", 6);
  cr_assert_str_eq(buf, "a??\xc3\xa9z");
  /* Cut on a character boundary, never inside one. */
  sd_msgstr(buf, sizeof buf, "\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5", 15);
  cr_assert_str_eq(buf, "\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5...");
  cr_assert(sd_utf8_valid(buf, strlen(buf), NULL));
  char dims[16];
  uint64_t v[3] = {123456, 7, 8};
  cr_assert_str_eq(sd_fmt_dims(dims, sizeof dims, 3, v), "[123456,7,8]");
  cr_assert_str_eq(sd_fmt_dims(dims, sizeof dims, 0, v), "[]");
  uint64_t big[3] = {18446744073709551615ULL, 1, 2};
  sd_fmt_dims(dims, sizeof dims, 3, big);
  cr_assert_str_eq(dims, "[...]");
}

/* ------------------------------------------------------------------------ *
 * Sizes
 * ------------------------------------------------------------------------ */
Test(size, numel_of_ordinary_scalar_and_empty_shapes) {
  uint64_t n = 99;
  uint64_t s[4] = {2, 3, 4, 0};
  cr_assert_eq(sd_tensor_numel("t", 3, s, &n, NULL), 0);
  cr_assert_eq(n, 24);
  cr_assert_eq(sd_tensor_numel("t", 0, s, &n, NULL), 0);
  cr_assert_eq(n, 1, "a 0-d tensor has one element");
  cr_assert_eq(sd_tensor_numel("t", 4, s, &n, NULL), 0);
  cr_assert_eq(n, 0);
  uint64_t z[2] = {0, 5};
  cr_assert_eq(sd_tensor_numel("t", 2, z, &n, NULL), 0);
  cr_assert_eq(n, 0);
}

Test(size, numel_overflow_is_caught_in_any_order) {
  sd_error err = {0};
  uint64_t n;
  uint64_t a[2] = {1ULL << 32, 1ULL << 32};
  cr_assert_eq(sd_tensor_numel("w", 2, a, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor 'w': shape [4294967296,4294967296] has too many elements");
  /* A zero dimension does not excuse the others: a reader multiplying
   * left to right would overflow before reaching it. */
  uint64_t b[3] = {1ULL << 40, 1ULL << 40, 0};
  cr_assert_eq(sd_tensor_numel("w", 3, b, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  uint64_t c[3] = {0, 1ULL << 40, 1ULL << 40};
  cr_assert_eq(sd_tensor_numel("w", 3, c, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  uint64_t d[1] = {1ULL << 63};
  cr_assert_eq(sd_tensor_numel("w", 1, d, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "dimension 0"), "%s", err.msg);
  uint64_t e[1] = {(uint64_t)INT64_MAX};
  cr_assert_eq(sd_tensor_numel("w", 1, e, &n, &err), 0);
  cr_assert_eq(n, (uint64_t)INT64_MAX);
  uint64_t f[SD_MAX_DIMS + 1] = {0};
  cr_assert_eq(sd_tensor_numel("w", SD_MAX_DIMS + 1, f, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "17 dimensions"), "%s", err.msg);
}

Test(size, nbytes_checks_every_multiplication) {
  sd_error err = {0};
  uint64_t nb = 0;
  sd_tensor t = {.name = "x", .dtype = SD_DT_F32, .ndim = 2, .shape = {2, 3}, .index = -1};
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), 0);
  cr_assert_eq(nb, 24);
  t.dtype = SD_DT_F64;
  t.ndim = 1;
  t.shape[0] = 1ULL << 60; /* 2^63 bytes: past INT64_MAX */
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor 'x': byte size of F64[1152921504606846976] overflows");
  t.shape[0] = (1ULL << 59) + 1;
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), 0);
  cr_assert_eq(nb, (1ULL << 62) + 8);
  t.dtype = SD_DT_I32;
  t.ndim = 3;
  t.shape[0] = 0;
  t.shape[1] = 1ULL << 61;
  t.shape[2] = 2;
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), SHARDD_E_INVALID_ARGUMENT,
               "zero-size, but 2^62 elements of 4 bytes overflow when multiplied in order");
  t.shape[1] = 7;
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), 0);
  cr_assert_eq(nb, 0);
  t.ndim = 0;
  t.dtype = SD_DT_BF16;
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), 0);
  cr_assert_eq(nb, 2, "a scalar holds one element");
  t.dtype = (sd_dtype)SD_DT__COUNT;
  cr_assert_eq(sd_tensor_nbytes(&t, &nb, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "tensor 'x': invalid dtype"), "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * Natural order
 * ------------------------------------------------------------------------ */
static int sgn(int x) { return (x > 0) - (x < 0); }

Test(natural, examples) {
  struct {
    const char *a, *b;
    int want;
  } c[] = {
      {"layers.2", "layers.10", -1},
      {"model.layers.2.mlp.weight", "model.layers.10.attn.weight", -1},
      {"layers.9.b", "layers.09.a", 1},    /* the number is equal; 'b' > 'a' decides */
      {"a1", "a01", -1},                   /* equal numbers: fewer zeros first */
      {"a01b2", "a1b02", 1},               /* the first zero difference decides */
      {"a0", "a00", -1},
      {"a", "a0", -1},
      {"", "a", -1},
      {"a", "a", 0},
      {"abc", "abd", -1},
      {"a.", "a1", -1},                    /* '.' < digits */
      {"a1", "a_", -1},                    /* digits < '_' */
      {"x99999999999999999999999", "x100000000000000000000000", -1},
      {"x123456789012345678901234567890", "x123456789012345678901234567891", -1},
      {"z", "\xc3\xa9", -1},
      {"w9", "w10x", -1},
      {"a10", "a9z", 1},
      {"layer.1.10", "layer.1.9", 1},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    cr_assert_eq(sgn(sd_natural_cmp(c[i].a, c[i].b)), c[i].want, "%s vs %s", c[i].a, c[i].b);
    cr_assert_eq(sgn(sd_natural_cmp(c[i].b, c[i].a)), -c[i].want, "%s vs %s", c[i].b, c[i].a);
  }
}

/* Reference: split into tokens, compare token lists, then leading zeros. */
typedef struct {
  int digit;
  const char *p; /* significant digits, or the byte */
  size_t len;
  size_t zeros;
} tok;

static size_t tokenize(const char *s, tok *out) {
  size_t n = 0;
  while (*s) {
    if (*s >= '0' && *s <= '9') {
      const char *st = s;
      while (*s == '0') s++;
      const char *sig = s;
      while (*s >= '0' && *s <= '9') s++;
      out[n++] = (tok){1, sig, (size_t)(s - sig), (size_t)(sig - st)};
    } else {
      out[n++] = (tok){0, s, 1, 0};
      s++;
    }
  }
  return n;
}

static int ref_cmp(const char *a, const char *b) {
  tok ta[64], tb[64];
  size_t na = tokenize(a, ta), nb = tokenize(b, tb);
  for (size_t i = 0; i < na && i < nb; i++) {
    if (ta[i].digit && tb[i].digit) {
      if (ta[i].len != tb[i].len) return ta[i].len < tb[i].len ? -1 : 1;
      int c = memcmp(ta[i].p, tb[i].p, ta[i].len);
      if (c) return sgn(c);
    } else {
      unsigned char ca = ta[i].digit ? '0' : (unsigned char)*ta[i].p;
      unsigned char cb = tb[i].digit ? '0' : (unsigned char)*tb[i].p;
      if (ca != cb) return ca < cb ? -1 : 1;
    }
  }
  if (na != nb) return na < nb ? -1 : 1;
  for (size_t i = 0; i < na; i++)
    if (ta[i].digit && ta[i].zeros != tb[i].zeros) return ta[i].zeros < tb[i].zeros ? -1 : 1;
  return 0;
}

Test(natural, agrees_with_a_tokenizing_reference_and_is_total) {
  enum { N = 700 };
  static char s[N][12];
  const char alpha[] = "00019a.b_";
  srand(11);
  for (int i = 0; i < N; i++) {
    int len = rand() % 10;
    for (int k = 0; k < len; k++) s[i][k] = alpha[rand() % (int)(sizeof alpha - 1)];
    s[i][len] = '\0';
  }
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < N; j++) {
      int c = sgn(sd_natural_cmp(s[i], s[j]));
      if (c != ref_cmp(s[i], s[j])) cr_assert_fail("'%s' vs '%s': %d", s[i], s[j], c);
      if ((c == 0) != (strcmp(s[i], s[j]) == 0)) cr_assert_fail("not total: '%s' '%s'", s[i], s[j]);
    }
  }
}

static int qcmp(const void *a, const void *b) {
  return sd_natural_cmp(*(const char *const *)a, *(const char *const *)b);
}

Test(natural, sorts_layer_names_like_a_person_would) {
  const char *v[] = {"layers.10.w", "layers.2.w", "layers.1.w", "embed", "layers.02.w", "layers.100.w",
                     "layers.9.w"};
  const char *want[] = {"embed", "layers.1.w", "layers.2.w", "layers.02.w", "layers.9.w",
                        "layers.10.w", "layers.100.w"};
  qsort(v, 7, sizeof v[0], qcmp);
  for (int i = 0; i < 7; i++) cr_assert_str_eq(v[i], want[i]);
}

/* ------------------------------------------------------------------------ *
 * Sort keys
 * ------------------------------------------------------------------------ */
static int keycmp(const unsigned char *a, size_t la, const unsigned char *b, size_t lb) {
  int c = memcmp(a, b, la < lb ? la : lb);
  if (c) return sgn(c);
  return la < lb ? -1 : la > lb;
}

Test(natural, byte_keys_order_like_the_comparison) {
  enum { N = 600 };
  static char s[N][24];
  static unsigned char k[N][100];
  static size_t kl[N];
  const char alpha[] = "000129a.b_~";
  srand(21);
  for (int i = 0; i < N; i++) {
    int len = rand() % 20;
    for (int j = 0; j < len; j++) s[i][j] = alpha[rand() % (int)(sizeof alpha - 1)];
    s[i][len] = '\0';
    cr_assert_leq(sd_natural_key_max((size_t)len), 100);
    kl[i] = sd_natural_key(s[i], (size_t)len, k[i]);
    cr_assert_leq(kl[i], sd_natural_key_max((size_t)len));
  }
  /* Worst case for the bound: single digits between separators. */
  unsigned char big[200];
  cr_assert_leq(sd_natural_key("1.2.3.4.5.6.7.8.9", 17, big), sd_natural_key_max(17));
  cr_assert_leq(sd_natural_key("1", 1, big), sd_natural_key_max(1));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      int want = sgn(sd_natural_cmp(s[i], s[j]));
      if (keycmp(k[i], kl[i], k[j], kl[j]) != want) cr_assert_fail("'%s' vs '%s'", s[i], s[j]);
    }
}

typedef struct {
  unsigned char b[64];
  size_t len;
  uint32_t idx;
} rkey;

static int rkey_cmp(const void *pa, const void *pb) {
  const rkey *a = pa, *b = pb;
  int c = keycmp(a->b, a->len, b->b, b->len);
  if (c) return c;
  return a->idx < b->idx ? -1 : a->idx > b->idx; /* stability */
}

Test(sortkeys, matches_qsort_and_is_stable) {
  srand(33);
  for (int round = 0; round < 300; round++) {
    size_t n = (size_t)(rand() % (round % 10 == 0 ? 5000 : 200));
    rkey *r = calloc(n + 1, sizeof *r);
    sd_skey *k = calloc(n + 1, sizeof *k);
    size_t plen = (size_t)(rand() % 40); /* shared prefix, often past one chunk */
    for (size_t i = 0; i < n; i++) {
      size_t len = plen + (size_t)(rand() % 12);
      if (len > 64) len = 64;
      for (size_t j = 0; j < len; j++)
        r[i].b[j] = j < plen ? (unsigned char)('a' + j % 3) : (unsigned char)(rand() % 4); /* zeros too */
      if (rand() % 5 == 0 && i > 0) { /* exact duplicates */
        memcpy(r[i].b, r[i - 1].b, 64);
        len = r[i - 1].len;
      }
      r[i].len = len;
      r[i].idx = (uint32_t)i;
      k[i] = (sd_skey){r[i].b, (uint32_t)len, (uint32_t)i};
    }
    cr_assert_eq(sd_sort_keys(k, n), 0);
    qsort(r, n, sizeof *r, rkey_cmp);
    for (size_t i = 0; i < n; i++) cr_assert_eq(k[i].idx, r[i].idx, "round %d pos %zu", round, i);
    free(r);
    free(k);
  }
}

Test(sortkeys, presorted_runs_are_merged_stably) {
  srand(44);
  for (int round = 0; round < 200; round++) {
    size_t runs = 1 + (size_t)(round % 40); /* both sides of the merge limit */
    size_t n = runs * (1 + (size_t)(rand() % 50));
    rkey *r = calloc(n + 1, sizeof *r);
    sd_skey *k = calloc(n + 1, sizeof *k);
    for (size_t i = 0; i < n; i++) {
      r[i].len = 1 + (size_t)(rand() % 3);
      for (size_t j = 0; j < r[i].len; j++) r[i].b[j] = (unsigned char)('a' + rand() % 3);
      r[i].idx = (uint32_t)i;
    }
    /* Sort each block so the input is `runs` ascending runs (or fewer). */
    size_t per = n / runs;
    for (size_t b = 0; b < runs; b++) qsort(r + b * per, b == runs - 1 ? n - b * per : per, sizeof *r, rkey_cmp);
    for (size_t i = 0; i < n; i++) k[i] = (sd_skey){r[i].b, (uint32_t)r[i].len, r[i].idx};
    cr_assert_eq(sd_sort_keys(k, n), 0);
    /* Stability is by input position, which after the block sorts is the
     * array position: re-number before the reference sort. */
    uint32_t *pos = malloc((n + 1) * sizeof *pos);
    for (size_t i = 0; i < n; i++) pos[r[i].idx] = (uint32_t)i;
    for (size_t i = 0; i < n; i++) r[i].idx = (uint32_t)i;
    qsort(r, n, sizeof *r, rkey_cmp);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(pos[k[i].idx], r[i].idx, "round %d (%zu runs) pos %zu", round, runs, i);
    free(pos);
    free(r);
    free(k);
  }
}
