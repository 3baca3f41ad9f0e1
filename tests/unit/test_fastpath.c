/* The planner's fast paths (word-at-a-time JSON escaping, number printing, shared header block, scratch reuse) against plain references. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

static uint64_t rs = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

/* ------------------------------------------------------------------------ *
 * References: jansson, an encoder written by others, not a second copy of
 * header.c's byte path. It prints \u escapes in upper-case hex where
 * serde_json and Python print lower-case, so those are folded, and keeps
 * DEL, which Python's ensure_ascii escapes.
 * ------------------------------------------------------------------------ */
static size_t ref_json(char *o, const char *s, size_t n, size_t flags) {
  json_t *j = json_stringn(s, n);
  cr_assert_not_null(j, "the test built invalid UTF-8");
  char *d = json_dumps(j, JSON_ENCODE_ANY | flags);
  json_decref(j);
  size_t k = strlen(d);
  for (size_t i = 0; i < k; i++) {
    if (d[i] != '\\') continue;
    if (d[i + 1] == 'u')
      for (size_t h = i + 2; h < i + 6; h++) d[h] = (char)tolower((unsigned char)d[h]);
    i += d[i + 1] == 'u' ? 5 : 1;
  }
  /* Python's ensure_ascii escapes DEL too (everything outside ' '..'~'); jansson keeps it. */
  size_t w = 0;
  for (size_t i = 0; i < k; i++) {
    if (flags & JSON_ENSURE_ASCII && d[i] == 0x7f) {
      memcpy(o + w, "\\u007f", 6);
      w += 6;
    } else {
      o[w++] = d[i];
    }
  }
  free(d);
  return w;
}

/* serde_json: '"', '\\' and C0 controls escaped, every other byte kept. It
 * works byte by byte, so lone high bytes (not UTF-8, which jansson refuses)
 * pass through raw and only the ASCII runs between them go to jansson. */
static size_t ref_json_str(char *o, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t k = 0;
  o[k++] = '"';
  for (size_t i = 0; i < n;) {
    size_t j = i;
    if (u[i] >= 0x80) {
      while (j < n && u[j] >= 0x80) o[k++] = (char)u[j++];
    } else {
      while (j < n && u[j] < 0x80) j++;
      size_t w = ref_json(o + k, s + i, j - i, 0);
      memmove(o + k, o + k + 1, w - 2); /* its quotes dropped */
      k += w - 2;
    }
    i = j;
  }
  o[k++] = '"';
  return k;
}

/* Python's ensure_ascii, for valid UTF-8. */
static size_t ref_json_str_ascii(char *o, const char *s, size_t n) { return ref_json(o, s, n, JSON_ENSURE_ASCII); }

/* Pieces that stress both the word path and the byte path: plain runs
 * (long enough to fill words), each escape, controls, DEL, and UTF-8 at
 * the edges of every sequence length. */
static const char *const pieces[] = {
    "a", "Z", "0", "9", ".", "/", " ", "~", "model.layers.", "self_attn.q_proj.weight",
    "\"", "\\", "\"\\", "\\\\\"", "\x7f", "\x01", "\x1f", "\b", "\f", "\n", "\r", "\t",
    "\xc2\x80", "\xdf\xbf", "\xc3\xa9", "\xe0\xa0\x80", "\xed\x9f\xbf", "\xee\x80\x80",
    "\xef\xbf\xbf", "\xe2\x82\xac", "\xf0\x90\x80\x80", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf",
};
#define NPIECES (sizeof pieces / sizeof pieces[0])
#define FIRST_CONTROL 14 /* pieces[14..21] are DEL and C0 controls */
#define LAST_CONTROL 21

static size_t tricky(char *buf, size_t cap, int controls) {
  size_t len = 0, np = rnd() % 12;
  for (size_t j = 0; j < np; j++) {
    size_t pi = rnd() % NPIECES;
    if (!controls && pi >= FIRST_CONTROL && pi <= LAST_CONTROL) pi = rnd() % 10;
    size_t pl = strlen(pieces[pi]);
    if (len + pl >= cap) break;
    memcpy(buf + len, pieces[pi], pl);
    len += pl;
  }
  return len;
}

/* Every encoder on s at every alignment, against the references. */
static void check_both(const char *s, size_t n, int ascii_too) {
  static char in[1200], want[8000], got[8000 + 8];
  cr_assert_lt(n + 8, sizeof in);
  for (size_t shift = 0; shift < 8; shift++) {
    memcpy(in + shift, s, n);
    size_t wl = ref_json_str(want, in + shift, n);
    memset(got, 0x55, sizeof got);
    char *end = sd_json_str_put(got + shift, in + shift, n);
    cr_assert_leq((size_t)(end - got - shift), SD_JSON_STR_MAX(n));
    cr_assert_eq((size_t)(end - got - shift), wl, "serde length for '%.*s'", (int)n, s);
    cr_assert_eq(memcmp(got + shift, want, wl), 0, "serde bytes for '%.*s'", (int)n, s);
    cr_assert_eq((unsigned char)*end, 0x55, "wrote past the end");

    sd_buf b = {0};
    sd_buf_putc(&b, 'x');
    sd_buf_json_str(&b, in + shift, n);
    cr_assert_eq(b.len, wl + 1);
    cr_assert_eq(memcmp(b.p + 1, want, wl), 0);
    free(b.p);
    if (!ascii_too) continue;

    wl = ref_json_str_ascii(want, in + shift, n);
    memset(got, 0x55, sizeof got);
    end = sd_json_str_ascii_put(got + shift, in + shift, n);
    cr_assert_leq((size_t)(end - got - shift), SD_JSON_STR_MAX(n));
    cr_assert_eq((size_t)(end - got - shift), wl, "ascii length for '%.*s'", (int)n, s);
    cr_assert_eq(memcmp(got + shift, want, wl), 0, "ascii bytes for '%.*s'", (int)n, s);
    cr_assert_eq((unsigned char)*end, 0x55, "wrote past the end");
    b = (sd_buf){0};
    sd_buf_json_str_ascii(&b, in + shift, n);
    cr_assert_eq(b.len, wl);
    cr_assert_eq(memcmp(b.p, want, wl), 0);
    free(b.p);
  }
}

Test(jsonesc, random_tricky_strings_match_the_byte_at_a_time_escapers) {
  char s[1024];
  for (int round = 0; round < 20000; round++) {
    size_t n = tricky(s, sizeof s, round % 2);
    check_both(s, n, 1);
  }
}

Test(jsonesc, every_byte_at_every_word_position) {
  /* One special byte inside plain text, at each offset of a 24-byte
   * string, so it lands in every lane of a word and in the tail. */
  char s[24];
  for (unsigned c = 0; c < 256; c++) {
    for (size_t at = 0; at < sizeof s; at++) {
      memset(s, 'q', sizeof s);
      s[at] = (char)c;
      check_both(s, sizeof s, c < 0x80); /* lone high bytes are not UTF-8 */
      check_both(s, at + 1, c < 0x80);
    }
  }
}

Test(jsonesc, every_code_point_at_several_offsets) {
  char s[32];
  for (uint32_t cp = 1; cp <= 0x10FFFF; cp += cp < 0x3000 ? 1 : 97) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    unsigned char u[4];
    size_t k;
    if (cp < 0x80) {
      u[0] = (unsigned char)cp;
      k = 1;
    } else if (cp < 0x800) {
      u[0] = (unsigned char)(0xC0 | (cp >> 6));
      u[1] = (unsigned char)(0x80 | (cp & 0x3F));
      k = 2;
    } else if (cp < 0x10000) {
      u[0] = (unsigned char)(0xE0 | (cp >> 12));
      u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
      u[2] = (unsigned char)(0x80 | (cp & 0x3F));
      k = 3;
    } else {
      u[0] = (unsigned char)(0xF0 | (cp >> 18));
      u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
      u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
      u[3] = (unsigned char)(0x80 | (cp & 0x3F));
      k = 4;
    }
    size_t at = cp % 13;
    memset(s, 'p', sizeof s);
    memcpy(s + at, u, k);
    check_both(s, at + k + cp % 7, 1);
  }
}

Test(jsonesc, long_strings_cross_the_buffer_slices) {
  /* The buffer encoders work in slices of a few KB; put every kind of
   * sequence across each slice boundary. */
  enum { LEN = 13000 };
  static char s[LEN + 16], want[6 * LEN + 64];
  static const char *const seqs[] = {"\xf0\x9f\x98\x80", "\xe2\x82\xac", "\xc3\xa9", "\"", "\\", "\x01"};
  for (size_t q = 0; q < sizeof seqs / sizeof seqs[0]; q++) {
    for (size_t lead = 4088; lead <= 4096; lead++) {
      size_t n = 0, sl = strlen(seqs[q]);
      memset(s, 'x', lead);
      n = lead;
      while (n + sl < LEN) {
        memcpy(s + n, seqs[q], sl);
        n += sl;
        if (rnd() % 3 == 0) s[n++] = 'y';
      }
      size_t wl = ref_json_str(want, s, n);
      sd_buf b = {0};
      sd_buf_json_str(&b, s, n);
      cr_assert_eq(b.len, wl, "serde, seq %zu lead %zu", q, lead);
      cr_assert_eq(memcmp(b.p, want, wl), 0, "serde, seq %zu lead %zu", q, lead);
      free(b.p);
      wl = ref_json_str_ascii(want, s, n);
      b = (sd_buf){0};
      sd_buf_json_str_ascii(&b, s, n);
      cr_assert_eq(b.len, wl, "ascii, seq %zu lead %zu", q, lead);
      cr_assert_eq(memcmp(b.p, want, wl), 0, "ascii, seq %zu lead %zu", q, lead);
      free(b.p);
    }
  }
}

Test(jsonesc, exact_escapes_by_hand) {
  char got[64];
  char *e = sd_json_str_ascii_put(got, "layers.0.\"\xc3\xa9\"\\\x7f", 15);
  *e = '\0';
  cr_assert_str_eq(got, "\"layers.0.\\\"\\u00e9\\\"\\\\\\u007f\"");
  e = sd_json_str_put(got, "abcdefgh\x01ijklmnop\xf0\x9f\x98\x80", 21);
  *e = '\0';
  cr_assert_str_eq(got, "\"abcdefgh\\u0001ijklmnop\xf0\x9f\x98\x80\"");
}

/* ------------------------------------------------------------------------ *
 * Numbers
 * ------------------------------------------------------------------------ */
static void check_u64(uint64_t v) {
  char want[32], got[32];
  int wl = snprintf(want, sizeof want, "%llu", (unsigned long long)v);
  memset(got, 0x55, sizeof got);
  char *e = sd_put_u64(got, v);
  cr_assert_eq(e - got, wl, "%s", want);
  cr_assert_eq(memcmp(got, want, (size_t)wl), 0, "%s", want);
  cr_assert_eq((unsigned char)*e, 0x55);
  cr_assert_eq(sd_u64_digits(v), (unsigned)wl);
  cr_assert_leq(wl, SD_U64_DIGITS_MAX);
  sd_buf b = {0};
  sd_buf_put_u64(&b, v);
  cr_assert_eq(b.len, (size_t)wl);
  cr_assert_eq(memcmp(b.p, want, (size_t)wl), 0);
  free(b.p);
}

Test(numbers, decimal_matches_printf) {
  uint64_t p = 1;
  for (int k = 0; k < 20; k++, p *= 10) {
    check_u64(p);
    check_u64(p - 1);
    check_u64(p + 1);
    check_u64(p * 5);
  }
  check_u64(UINT64_MAX);
  check_u64((uint64_t)INT64_MAX);
  for (int i = 0; i < 100000; i++) check_u64(rnd() >> (rnd() % 64));
}

/* ------------------------------------------------------------------------ *
 * Sorting in caller scratch, big allocations
 * ------------------------------------------------------------------------ */
static int key_cmp(const void *pa, const void *pb) {
  const sd_skey *a = pa, *b = pb;
  uint32_t m = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->key, b->key, m);
  if (c) return c;
  if (a->len != b->len) return a->len < b->len ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

Test(sortkeys, scratch_or_not_gives_the_same_stable_order) {
  enum { N = 5000 };
  static unsigned char bytes[N][6];
  static sd_skey a[N], b[N], c[N];
  for (int round = 0; round < 6; round++) {
    size_t n = round < 3 ? N : 1 + rnd() % 100;
    for (size_t i = 0; i < n; i++) {
      uint32_t len = (uint32_t)(rnd() % 6);
      for (uint32_t j = 0; j < len; j++) bytes[i][j] = (unsigned char)("ab\0c"[rnd() % 4]);
      /* round 1: a few sorted runs, the merge path */
      if (round == 1) {
        len = 4;
        uint32_t v = (uint32_t)(i % 700 * 7 + i / 700);
        for (int j = 0; j < 4; j++) bytes[i][j] = (unsigned char)(v >> (8 * (3 - j)));
      }
      a[i] = (sd_skey){bytes[i], len, (uint32_t)i};
    }
    memcpy(b, a, n * sizeof *a);
    memcpy(c, a, n * sizeof *a);
    qsort(a, n, sizeof *a, key_cmp);
    size_t need = sd_sort_keys_scratch(n);
    void *scratch = malloc(need);
    cr_assert_eq(sd_sort_keys_in(b, n, scratch, need), 0);
    cr_assert_eq(sd_sort_keys_in(c, n, scratch, need / 4), 0); /* too small: allocates */
    for (size_t i = 0; i < n; i++) {
      cr_assert_eq(b[i].idx, a[i].idx, "round %d at %zu", round, i);
      cr_assert_eq(c[i].idx, a[i].idx, "round %d at %zu", round, i);
    }
    free(scratch);
  }
}

Test(bigalloc, small_and_large_blocks_are_plain_malloc_memory) {
  size_t sizes[] = {0, 1, 4095, SD_BIG_ALLOC_MIN - 1, SD_BIG_ALLOC_MIN, SD_BIG_ALLOC_MIN * 3 + 17};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = sd_big_alloc(sizes[i] ? sizes[i] : 1);
    cr_assert_not_null(p);
    size_t n = sizes[i] ? sizes[i] : 1;
    memset(p, 0xA5, n);
    cr_assert_eq(p[n - 1], 0xA5);
    p = realloc(p, n + 100);
    cr_assert_not_null(p);
    cr_assert_eq(p[n - 1], 0xA5);
    free(p);
  }
}

/* ------------------------------------------------------------------------ *
 * The planner's own paths: one header block, scratch fallbacks, the index
 * growing past its estimate, names the quick scan passes to the full check.
 * ------------------------------------------------------------------------ */
static sd_tensor u8(const char *name, uint64_t bytes) {
  sd_tensor t = {.name = name, .dtype = SD_DT_U8, .ndim = 1, .index = -1};
  t.shape[0] = bytes;
  return t;
}

static uint64_t le64(const char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)(unsigned char)p[i] << (8 * i);
  return v;
}

Test(planblock, many_files_share_one_block_and_each_header_is_exact) {
  /* 40 files: more than the first guess of the block's size allows for. */
  enum { N = 40 };
  static char names[N][16];
  sd_tensor t[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "w.%d", i);
    t[i] = u8(names[i], 3);
  }
  static const sd_kv meta[] = {{"step", "7"}};
  sd_plan_opts o = {.max_shard_size = 1, .metadata = meta, .nmetadata = 1};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, N, &o, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, N);
  cr_assert_not_null(p.headers);
  const char *at = p.headers;
  for (size_t f = 0; f < p.nfiles; f++) {
    const sd_plan_file *pf = &p.files[f];
    cr_assert_eq(pf->header, at, "headers are consecutive in the block");
    at += pf->header_size;
    cr_assert_eq(pf->ntensors, 1);
    char want[256];
    int wl = snprintf(want, sizeof want,
                      "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"7\"},"
                      "\"%s\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                      t[pf->tensors[0]].name);
    cr_assert_eq(le64(pf->header), 4088);
    cr_assert_eq(memcmp(pf->header + 8, want, (size_t)wl), 0, "%.200s", pf->header + 8);
    for (size_t i = 8 + (size_t)wl; i < pf->header_size; i++) cr_assert_eq(pf->header[i], ' ');
  }
  sd_plan_free(&p);
  cr_assert_null(p.headers);
}

Test(planblock, the_block_grows_when_the_file_count_outruns_its_guess) {
  /* 1 MB of metadata in each of 100 files is more than the block first
   * reserves room for. */
  enum { N = 100 };
  static char names[N][16];
  sd_tensor t[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "w.%d", i);
    t[i] = u8(names[i], 3);
  }
  size_t vlen = 1u << 20;
  char *value = malloc(vlen + 1);
  memset(value, 'v', vlen);
  value[vlen] = '\0';
  sd_kv meta[] = {{"big", value}};
  sd_plan_opts o = {.max_shard_size = 1, .metadata = meta, .nmetadata = 1};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, N, &o, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, N);
  static const char pre[] = "{\"__metadata__\":{\"format\":\"pt\",\"big\":\"";
  const size_t pl = sizeof pre - 1;
  const char *at = p.headers;
  for (size_t f = 0; f < p.nfiles; f++) {
    const sd_plan_file *pf = &p.files[f];
    cr_assert_eq(pf->header, at);
    at += pf->header_size;
    cr_assert_eq(le64(pf->header) + 8, pf->header_size);
    cr_assert_eq(memcmp(pf->header + 8, pre, pl), 0);
    for (size_t i = 0; i < vlen; i += 4096) cr_assert_eq(pf->header[8 + pl + i], 'v');
    char tail[128];
    int tl = snprintf(tail, sizeof tail, "\"},\"%s\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                      t[pf->tensors[0]].name);
    cr_assert_eq(memcmp(pf->header + 8 + pl + vlen, tail, (size_t)tl), 0);
    for (size_t i = 8 + pl + vlen + (size_t)tl; i < pf->header_size; i++) cr_assert_eq(pf->header[i], ' ');
    cr_assert_eq(p.loc[pf->tensors[0]].file, f);
    cr_assert_eq(p.loc[pf->tensors[0]].file_offset, pf->header_size);
  }
  sd_plan_free(&p);
  free(value);
}

static const sd_tensor *g_t;
static int nat_cmp(const void *a, const void *b) {
  return sd_natural_cmp(g_t[*(const uint32_t *)a].name, g_t[*(const uint32_t *)b].name);
}

Test(planblock, names_whose_sort_keys_outgrow_the_block_still_sort_naturally) {
  /* Many short digit runs make natural keys several times longer than
   * the header entries the block is sized for. */
  enum { N = 300 };
  static char names[N][1000];
  static sd_tensor t[N];
  for (int i = 0; i < N; i++) {
    size_t len = 0;
    while (len < 900) len += (size_t)snprintf(names[i] + len, 1000 - len, "%u.", (unsigned)(rnd() % 10));
    snprintf(names[i] + len, 1000 - len, "%d", i);
    t[i] = u8(names[i], 1);
    if (i % 3 == 0) t[i].index = i % 5; /* and the position sort after it */
  }
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, N, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, 1);
  /* Header order is name bytes within one dtype: check it, then check
   * the walk indirectly through a split that keeps the walk order. */
  for (size_t i = 1; i < N; i++)
    cr_assert_lt(strcmp(t[p.files[0].tensors[i - 1]].name, t[p.files[0].tensors[i]].name), 0);
  sd_plan_free(&p);

  sd_plan_opts o = {.max_shard_size = 1};
  cr_assert_eq(sd_plan_build(&p, t, N, &o, &err), 0, "%s", err.msg);
  /* Positions first (0..4), each one file (tensors sharing a position are one entry), then the
   * rest one by one in natural order. */
  enum { GROUPS = 5, INDEXED = (N + 2) / 3 };
  cr_assert_eq(p.nfiles, GROUPS + N - INDEXED);
  for (size_t f = 0; f < GROUPS; f++) {
    cr_assert_eq(p.files[f].ntensors, INDEXED / GROUPS, "file %zu", f);
    for (size_t i = 0; i < p.files[f].ntensors; i++) cr_assert_eq(t[p.files[f].tensors[i]].index, (int64_t)f);
  }
  uint32_t ord[N], k = 0;
  g_t = t;
  for (uint32_t i = 0; i < N; i++)
    if (t[i].index < 0) ord[k++] = i;
  qsort(ord, k, sizeof *ord, nat_cmp);
  cr_assert_eq(k, N - INDEXED);
  for (size_t f = 0; f < k; f++) cr_assert_eq(p.files[GROUPS + f].tensors[0], ord[f], "file %zu", GROUPS + f);
  sd_plan_free(&p);
}

Test(planblock, index_grows_past_its_estimate_for_escaped_names) {
  /* Non-ASCII and quotes expand up to six-fold under ensure_ascii. */
  enum { N = 400 };
  static char names[N][700];
  static sd_tensor t[N];
  for (int i = 0; i < N; i++) {
    size_t len = (size_t)snprintf(names[i], sizeof names[i], "%03d", i);
    while (len < 600) {
      const char *pc = rnd() % 2 ? "\xf0\x9f\x98\x80" : "\"\xc3\xa9\\";
      memcpy(names[i] + len, pc, strlen(pc));
      len += strlen(pc);
    }
    names[i][len] = '\0';
    t[i] = u8(names[i], 10);
  }
  sd_plan_opts o = {.max_shard_size = 100};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, N, &o, &err), 0, "%s", err.msg);
  size_t len;
  char *ix = sd_index_encode(&p, t, &len, &err);
  cr_assert_not_null(ix, "%s", err.msg);

  /* The expected text, assembled the slow way (names start with their
   * number, so sorted order is input order). */
  sd_buf w = {0};
  sd_buf_puts(&w, "{\n  \"metadata\": {\n    \"total_parameters\": 4000,\n    \"total_size\": 4000\n");
  sd_buf_puts(&w, "  },\n  \"weight_map\": {");
  static char esc[8000];
  for (int i = 0; i < N; i++) {
    sd_buf_puts(&w, i ? ",\n    " : "\n    ");
    size_t el = ref_json_str_ascii(esc, names[i], strlen(names[i]));
    sd_buf_put(&w, esc, el);
    char fn[80];
    snprintf(fn, sizeof fn, ": \"model-%05d-of-%05zu.safetensors\"", i / 10 + 1, p.nfiles);
    sd_buf_puts(&w, fn);
  }
  sd_buf_puts(&w, "\n  }\n}\n");
  cr_assert_eq(len, w.len);
  cr_assert_eq(memcmp(ix, w.p, len), 0);
  cr_assert_eq(ix[len], '\0');
  free(w.p);
  free(ix);
  sd_plan_free(&p);
}

Test(planblock, quick_name_scan_agrees_with_the_full_check) {
  /* Whatever the planner accepts, sd_name_check accepts, and refusals
   * carry sd_name_check's own message. */
  static const char *const bytes[] = {"a", "0", ".", "\"", "\\", "\x7f", "\x01", "\x1f",
                                      "\xc3\xa9", "\xc3", "\xa9", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                      "\xe2\x82\xac", "\xff", "\xc0\xaf", "abcdefgh"};
  char name[64];
  for (int round = 0; round < 30000; round++) {
    size_t len = 0, np = rnd() % 9;
    for (size_t j = 0; j < np; j++) {
      const char *pc = bytes[rnd() % (sizeof bytes / sizeof bytes[0])];
      if (rnd() % 4) pc = bytes[rnd() % 3];
      size_t pl = strlen(pc);
      memcpy(name + len, pc, pl);
      len += pl;
    }
    if (round % 1000 == 0) {
      memcpy(name, "__metadata__", 12);
      len = 12;
    }
    name[len] = '\0';
    sd_tensor t = u8(name, 1);
    sd_plan p;
    sd_error e1 = {0}, e2 = {0};
    int want = sd_name_check(name, len, &e1);
    int got = sd_plan_build(&p, &t, 1, NULL, &e2);
    cr_assert_eq(got, want, "'%s'", name);
    if (want)
      cr_assert_str_eq(e2.msg, e1.msg);
    else
      sd_plan_free(&p);
  }
  static char longname[SD_NAME_MAX + 2];
  memset(longname, 'x', sizeof longname - 1);
  sd_tensor t = u8(longname, 1);
  sd_plan p;
  sd_error e = {0};
  cr_assert_eq(sd_plan_build(&p, &t, 1, NULL, &e), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "over the 1024-byte limit"), "%s", e.msg);
  longname[SD_NAME_MAX] = '\0';
  cr_assert_eq(sd_plan_build(&p, &t, 1, NULL, &e), 0, "%s", e.msg);
  sd_plan_free(&p);
}

Test(planblock, duplicate_names_are_reported_before_bad_metadata) {
  /* The metadata is encoded early to size the block; its error still
   * comes after the walk's, as it always did. */
  sd_tensor t[] = {u8("a", 1), u8("a", 1)};
  static const sd_kv meta[] = {{"k", NULL}};
  sd_plan_opts o = {.metadata = meta, .nmetadata = 1};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 2, &o, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor 'a' is given twice");
  t[1].name = "b";
  cr_assert_eq(sd_plan_build(&p, t, 2, &o, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "metadata entry 0 has no value");
  cr_assert_eq(p.nfiles, 0);
}
