/* Recorded data checksums: the index's and a single file's parsed strictly, and the deep check (proto/verify.c) on real files. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture_dir.h"
#include "sd_checksum.h"
#include "sd_reader.h"

#define F1 "model-00001-of-00002.safetensors"
#define F2 "model-00002-of-00002.safetensors"
#define INDEX "model.safetensors.index.json"
#define WM "\"weight_map\":{\"a\":\"" F1 "\",\"c\":\"" F2 "\"}"

static void mk_tmp(void) { dir_setup("cksum", 1); }
static void rm_tmp(void) { dir_teardown(); }

/* One U8 tensor `tensor` of n bytes (seed, seed+1, ...), with `meta` inside __metadata__; returns
 * the data's CRC-32C, computed here as the recorder would. */
static uint32_t shard(const char *file, const char *tensor, size_t n, unsigned seed, const char *meta) {
  char js[512];
  size_t k = (size_t)snprintf(js, sizeof js,
                              "{\"__metadata__\":{\"format\":\"pt\"%s},\"%s\":{\"dtype\":\"U8\",\"shape\":[%zu],"
                              "\"data_offsets\":[0,%zu]}}",
                              meta, tensor, n, n);
  while (k % 8) js[k++] = ' ';
  unsigned char *b = malloc(8 + k + n);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)k >> (8 * i));
  memcpy(b + 8, js, k);
  for (size_t i = 0; i < n; i++) b[8 + k + i] = (unsigned char)(seed + i * 7);
  put(file, b, 8 + k + n);
  uint32_t crc = sd_crc32c(0, b + 8 + k, n);
  free(b);
  return crc;
}

static uint32_t c1, c2;

static void two_shards(void) {
  c1 = shard(F1, "a", 1000, 3, "");
  c2 = shard(F2, "c", 777, 9, "");
}

/* An index whose metadata carries `sums` (a JSON member, or "" for none). */
static void index_with(const char *sums) {
  char js[1024];
  snprintf(js, sizeof js, "{\"metadata\":{%s%s\"total_size\":1777}," WM "}", sums, *sums ? "," : "");
  put_str(INDEX, js);
}

static void index_good(void) {
  char hex1[9], hex2[9], sums[256];
  sd_crc32c_hex(c1, hex1);
  sd_crc32c_hex(c2, hex2);
  snprintf(sums, sizeof sums, "\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"%s\",\"" F2 "\":\"%s\"}", hex1, hex2);
  index_with(sums);
}

static void expect_read_fails(int code, const char *frag) {
  sd_ckpt c;
  sd_error err;
  sd_error_clear(&err);
  int rc = sd_ckpt_read(ckdir, &c, &err);
  cr_assert_eq(rc, code, "rc %s, want %s: %s", sd_err_name(rc), sd_err_name(code), err.msg);
  cr_assert_not_null(strstr(err.msg, frag), "message '%s' lacks '%s'", err.msg, frag);
  cr_assert_eq(c.nfiles, 0);
  sd_ckpt_free(&c);
}

/* Opens every file of c as the library does, runs the deep check, closes them. */
static int verify_all(const sd_ckpt *c, sd_error *err) {
  int fds[8];
  cr_assert_leq(c->nfiles, 8);
  for (size_t i = 0; i < c->nfiles; i++) {
    char path[256];
    path_of(path, sizeof path, c->files[i].name);
    cr_assert_geq(fds[i] = open(path, O_RDONLY), 0, "%s", path);
  }
  sd_error_clear(err);
  int rc = sd_ckpt_verify(c, fds, err);
  for (size_t i = 0; i < c->nfiles; i++) close(fds[i]);
  return rc;
}

static void flip(const char *name, off_t from_end) {
  char path[256];
  path_of(path, sizeof path, name);
  int fd = open(path, O_RDWR);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  unsigned char b;
  cr_assert_eq(pread(fd, &b, 1, st.st_size - from_end), 1);
  b ^= 0x10;
  cr_assert_eq(pwrite(fd, &b, 1, st.st_size - from_end), 1);
  close(fd);
}

TestSuite(cksum, .init = mk_tmp, .fini = rm_tmp);

/* ------------------------------------------------------------------------ *
 * Parsing what the index records
 * ------------------------------------------------------------------------ */

Test(cksum, index_checksums_are_read_per_file) {
  two_shards();
  index_good();
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(c.nfiles, 2);
  cr_assert(c.files[0].has_crc && c.files[1].has_crc);
  cr_assert_eq(c.files[0].crc, c1);
  cr_assert_eq(c.files[1].crc, c2);
  cr_assert_eq(verify_all(&c, &err), 0, "%s", err.msg);
  sd_ckpt_free(&c);
}

Test(cksum, upper_case_hex_is_taken) {
  two_shards();
  char sums[256];
  snprintf(sums, sizeof sums, "\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"%08" PRIX32 "\",\"" F2 "\":\"%08" PRIX32 "\"}",
           c1, c2);
  index_with(sums);
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(c.files[1].crc, c2);
  sd_ckpt_free(&c);
}

Test(cksum, an_index_without_checksums_reads_as_before) {
  two_shards();
  index_with("");
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert(!c.files[0].has_crc && !c.files[1].has_crc);
  /* Nothing to compare: the deep check says so instead of passing silently. */
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_CHECKSUM);
  cr_assert_not_null(strstr(err.msg, INDEX " records no checksums (written without them, or not by shardd)"),
                     "%s", err.msg);
  sd_ckpt_free(&c);
}

Test(cksum, malformed_index_checksums_are_refused_by_name) {
  two_shards();
  static const struct {
    const char *sums, *frag;
  } rows[] = {
      {"\"" SD_CHECKSUM_KEY "\":\"12345678\"", INDEX ": metadata." SD_CHECKSUM_KEY " is not an object of file names"},
      {"\"" SD_CHECKSUM_KEY "\":[]", "is not an object of file names"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":12345678,\"" F2 "\":\"00000000\"}",
       INDEX ": metadata." SD_CHECKSUM_KEY ": " F1 " -> a non-string is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"1234567\",\"" F2 "\":\"00000000\"}",
       INDEX ": metadata." SD_CHECKSUM_KEY ": " F1 " -> '1234567' is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"00000000\",\"" F2 "\":\"123456789\"}",
       F2 " -> '123456789' is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"0000000g\",\"" F2 "\":\"00000000\"}", "'0000000g' is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\" 0000000\",\"" F2 "\":\"00000000\"}", "' 0000000' is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"0x000000\",\"" F2 "\":\"00000000\"}", "'0x000000' is not 8 hex digits"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":null,\"" F2 "\":\"00000000\"}", F1 " -> a non-string"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"00000000\"}",
       INDEX ": metadata." SD_CHECKSUM_KEY " records no checksum for " F2},
      {"\"" SD_CHECKSUM_KEY "\":{}", "records no checksum for " F1},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"00000000\",\"" F2 "\":\"00000000\","
       "\"model-00003-of-00002.safetensors\":\"00000000\"}",
       INDEX ": metadata." SD_CHECKSUM_KEY " names model-00003-of-00002.safetensors, which the weight_map does not"},
      {"\"" SD_CHECKSUM_KEY "\":{\"" F1 "\":\"00000000\",\"" F1 "\":\"00000000\",\"" F2 "\":\"00000000\"}",
       "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    index_with(rows[i].sums);
    expect_read_fails(SHARDD_E_FORMAT, rows[i].frag);
  }
}

Test(cksum, index_parse_keeps_checksums_in_file_order) {
  const char *js = "{\"metadata\":{\"total_size\":0,\"" SD_CHECKSUM_KEY "\":{\"b.safetensors\":\"0000000b\","
                   "\"a.safetensors\":\"0000000a\"}},\"weight_map\":{\"x\":\"b.safetensors\",\"y\":\"a.safetensors\"}}";
  sd_st_index ix;
  sd_error err;
  cr_assert_eq(sd_st_index_parse("i.json", js, strlen(js), &ix, &err), 0, "%s", err.msg);
  cr_assert_not_null(ix.crcs);
  cr_assert_str_eq(ix.files[0], "a.safetensors");
  cr_assert_eq(ix.crcs[0], 0xa);
  cr_assert_eq(ix.crcs[1], 0xb);
  sd_st_index_free(&ix);
}

/* ------------------------------------------------------------------------ *
 * A single file's __metadata__
 * ------------------------------------------------------------------------ */

Test(cksum, single_file_checksum_from_its_metadata) {
  /* The recorded value is only known once the data is: write it, then write it again with its CRC. */
  uint32_t crc = shard("model.safetensors", "w", 5000, 1, "");
  char meta[64];
  snprintf(meta, sizeof meta, ",\"" SD_CHECKSUM_KEY "\":\"%08" PRIx32 "\"", crc);
  cr_assert_eq(shard("model.safetensors", "w", 5000, 1, meta), crc);
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert(c.files[0].has_crc);
  cr_assert_eq(c.files[0].crc, crc);
  cr_assert_eq(verify_all(&c, &err), 0, "%s", err.msg);
  sd_ckpt_free(&c);

  char path[256];
  path_of(path, sizeof path, "model.safetensors");
  cr_assert_eq(sd_ckpt_read_single(path, &c, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.files[0].name, "model.safetensors");
  cr_assert_eq(c.files[0].crc, crc);
  cr_assert_eq(c.total_size, 5000);
  flip("model.safetensors", 1);
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_CHECKSUM);
  cr_assert_not_null(strstr(err.msg, "model.safetensors: data CRC-32C is "), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, " but its __metadata__ records "), "%s", err.msg);
  sd_ckpt_free(&c);
}

Test(cksum, malformed_single_file_checksums_are_refused_by_name) {
  const char *bad[] = {"", "1234567", "123456789", "zzzzzzzz", "-1234567"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char meta[64], frag[128];
    snprintf(meta, sizeof meta, ",\"" SD_CHECKSUM_KEY "\":\"%s\"", bad[i]);
    shard("model.safetensors", "w", 10, 1, meta);
    snprintf(frag, sizeof frag, "model.safetensors: __metadata__ '" SD_CHECKSUM_KEY "' is '%s', not 8 hex digits",
             bad[i]);
    expect_read_fails(SHARDD_E_FORMAT, frag);
    char path[256];
    path_of(path, sizeof path, "model.safetensors");
    sd_ckpt c;
    sd_error err;
    cr_assert_eq(sd_ckpt_read_single(path, &c, &err), SHARDD_E_FORMAT);
    cr_assert_not_null(strstr(err.msg, frag), "%s", err.msg);
  }
  /* Not a string at all: the header's own rule already refuses it. */
  shard("model.safetensors", "w", 10, 1, ",\"" SD_CHECKSUM_KEY "\":305419896");
  expect_read_fails(SHARDD_E_FORMAT, "__metadata__ '" SD_CHECKSUM_KEY "' is not a string");
}

/* ------------------------------------------------------------------------ *
 * The deep check
 * ------------------------------------------------------------------------ */

Test(cksum, a_flipped_data_byte_is_named_with_both_values) {
  two_shards();
  index_good();
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  flip(F2, 100);
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_CHECKSUM);
  char want[128], hex[9];
  sd_crc32c_hex(c2, hex);
  snprintf(want, sizeof want, F2 ": data CRC-32C is ");
  cr_assert_eq(strncmp(err.msg, want, strlen(want)), 0, "%s", err.msg);
  snprintf(want, sizeof want, " but the index records %s (the file changed after it was saved: damaged, or swapped in "
           "from another checkpoint)", hex);
  cr_assert_not_null(strstr(err.msg, want), "%s", err.msg);
  /* The file itself, alone: its CRC is reported either way. */
  char path[256];
  path_of(path, sizeof path, F1);
  int fd = open(path, O_RDONLY);
  uint32_t got = 0;
  cr_assert_eq(sd_ckpt_file_verify(&c, 0, fd, &got, &err), 0, "%s", err.msg);
  cr_assert_eq(got, c1);
  close(fd);
  sd_ckpt_free(&c);
}

Test(cksum, a_file_cut_after_it_was_checked_is_named_truncated) {
  two_shards();
  index_good();
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  char path[256];
  path_of(path, sizeof path, F1);
  cr_assert_eq(truncate(path, (off_t)c.files[0].h.file_size - 10), 0);
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, F1 ": truncated: "), "%s", err.msg);
  sd_ckpt_free(&c);
  /* Read again, the strict reader refuses it, naming it truncated too. */
  expect_read_fails(SHARDD_E_FORMAT, F1 ": tensor 'a' data_offsets [0,1000] run past the end of the file");
  expect_read_fails(SHARDD_E_FORMAT, "the file is truncated");
}

Test(cksum, a_file_swapped_in_from_another_checkpoint_is_caught) {
  two_shards();
  index_good();
  /* Same header, same size, other weights. */
  shard(F1, "a", 1000, 4, "");
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_CHECKSUM);
  cr_assert_not_null(strstr(err.msg, F1 ": data CRC-32C is "), "%s", err.msg);
  sd_ckpt_free(&c);
}

Test(cksum, data_past_the_read_buffer) {
  /* 20 MiB: more than one 8 MiB read, the last one short. */
  size_t n = (20u << 20) + 12345;
  uint32_t crc = shard("model.safetensors", "w", n, 5, "");
  char meta[64];
  snprintf(meta, sizeof meta, ",\"" SD_CHECKSUM_KEY "\":\"%08" PRIx32 "\"", crc);
  shard("model.safetensors", "w", n, 5, meta);
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(verify_all(&c, &err), 0, "%s", err.msg);
  flip("model.safetensors", 1);
  cr_assert_eq(verify_all(&c, &err), SHARDD_E_CHECKSUM, "%s", err.msg);
  sd_ckpt_free(&c);
}

/* ------------------------------------------------------------------------ *
 * The checksum map is checked against the weight_map in one pass: 2,000,000
 * names the weight_map does not know are refused at the first, in memory
 * that does not grow with them (no JSON tree of the index)
 * ------------------------------------------------------------------------ */
#include <sys/resource.h>

static long rss_peak_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

Test(cksum, two_million_bogus_checksum_entries_are_refused_in_one_pass, .timeout = 120) {
  const size_t n = 2000000;
  size_t cap = 256 + n * 40, k = 0;
  char *js = malloc(cap);
  cr_assert_not_null(js);
  k += (size_t)snprintf(js + k, cap - k, "{\"metadata\":{\"total_size\":1,\"" SD_CHECKSUM_KEY "\":{");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf(js + k, cap - k, "%s\"bogus-%07zu.safetensors\":\"00000000\"", i ? "," : "", i);
  k += (size_t)snprintf(js + k, cap - k, "}},\"weight_map\":{\"w\":\"model.safetensors\"}}");
  cr_assert_lt(k, cap);
  long before = rss_peak_kib();
  sd_st_index ix;
  sd_error err;
  int rc = sd_st_index_parse("model.safetensors.index.json", js, k, &ix, &err);
  long grew = rss_peak_kib() - before;
  cr_assert_eq(rc, SHARDD_E_FORMAT);
  cr_assert_str_eq(err.msg, "model.safetensors.index.json: metadata." SD_CHECKSUM_KEY
                            " names bogus-0000000.safetensors, which the weight_map does not");
  printf("an index of %zu bytes with %zu bogus checksum entries: refused with %ld KiB more resident\n", k, n, grew);
#if !defined(__SANITIZE_ADDRESS__)
  cr_assert_lt(grew, 16 * 1024, "%ld KiB to refuse it", grew);
#endif
  free(js);
}

/* ------------------------------------------------------------------------ *
 * A file that grows while the deep check reads it is reported: another
 * thread appends 4 KiB as soon as inotify says the check has begun reading
 * ------------------------------------------------------------------------ */
#include <poll.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <time.h>

typedef struct {
  int inotify_fd; /* non-blocking */
  char path[256];
  int confirmed;  /* the check read the file again after the append: its last fstat comes later still */
} grower;

static int next_event(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char ev[4096];
  return poll(&p, 1, ms) == 1 && read(fd, ev, sizeof ev) > 0;
}

static void *grow_on_first_read(void *arg) {
  grower *g = arg;
  char ev[4096];
  if (!next_event(g->inotify_fd, 30000)) return NULL;
  int fd = open(g->path, O_WRONLY | O_APPEND);
  static const char more[4096];
  int ok = fd >= 0 && write(fd, more, sizeof more) == (ssize_t)sizeof more;
  if (fd >= 0) close(fd);
  while (read(g->inotify_fd, ev, sizeof ev) > 0) {} /* reads from before the append */
  g->confirmed = ok && next_event(g->inotify_fd, 2000);
  return NULL;
}

Test(cksum, a_file_grown_during_the_deep_check_is_reported, .timeout = 120) {
  const size_t data = 64u << 20; /* eight of the check's reads: the append lands while it reads */
  char js[128];
  int jl = snprintf(js, sizeof js, "{\"w\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", data, data);
  while (jl % 8) js[jl++] = ' ';
  unsigned char *b = calloc(1, 8 + (size_t)jl + data);
  cr_assert_not_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)jl >> (8 * i));
  memcpy(b + 8, js, (size_t)jl);
  int reported = 0;
  /* a scheduler may hold the appender past the check's last read: then the try proves nothing and is made again */
  for (int attempt = 0; attempt < 5 && !reported; attempt++) {
    put("model.safetensors", b, 8 + (size_t)jl + data);
    grower g = {.confirmed = 0};
    path_of(g.path, sizeof g.path, "model.safetensors");
    sd_ckpt c;
    sd_error err;
    cr_assert_eq(sd_ckpt_read_single(g.path, &c, &err), 0, "%s", err.msg);
    int fd = open(g.path, O_RDONLY);
    g.inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    cr_assert_geq(inotify_add_watch(g.inotify_fd, g.path, IN_ACCESS), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, grow_on_first_read, &g), 0);
    uint32_t got = 0;
    int rc = sd_ckpt_file_verify(&c, 0, fd, &got, &err);
    pthread_join(th, NULL);
    close(g.inotify_fd);
    close(fd);
    sd_ckpt_free(&c);
    if (!g.confirmed) continue;
    cr_assert_eq(rc, SHARDD_E_FORMAT, "a file grown during the check was reported %s (%s)", sd_err_name(rc), err.msg);
    cr_assert_not_null(strstr(err.msg, "model.safetensors: grown:"), "%s", err.msg);
    reported = 1;
  }
  cr_assert(reported, "the append never landed while the check ran");
  free(b);
}
