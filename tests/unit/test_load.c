/* libshardd's checkpoint reader: round trips of every dtype, boxes against index arithmetic, hostile files refused. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture_dir.h"
#include "sd_checksum.h"
#include "sd_writer_sync.h"
#include "shardd/shardd.h"

static void mk_tmp(void) { dir_setup("load", 0); }
static void rm_tmp(void) { dir_teardown(); }

TestSuite(load, .init = mk_tmp, .fini = rm_tmp);

/* Byte i of every tensor's data is a function of the tensor and i, so a
 * misplaced run shows up as a wrong byte. */
static unsigned char pattern(size_t tensor, uint64_t i) { return (unsigned char)(i * 131 + tensor * 7 + (i >> 8)); }

static unsigned char *make_data(size_t tensor, uint64_t n) {
  unsigned char *p = malloc(n ? n : 1);
  for (uint64_t i = 0; i < n; i++) p[i] = pattern(tensor, i);
  return p;
}

static void write_ckpt(const sd_tensor *t, size_t n, uint64_t max_shard, size_t *nfiles) {
  const void **data = calloc(n, sizeof *data);
  for (size_t i = 0; i < n; i++) {
    uint64_t nb;
    cr_assert_eq(sd_tensor_nbytes(&t[i], &nb, NULL), 0);
    data[i] = make_data(i, nb);
  }
  sd_plan_opts opts = {.max_shard_size = max_shard};
  sd_write_result res;
  sd_error err;
  sd_error_clear(&err);
  cr_assert_eq(sd_write_checkpoint_sync(ckdir, t, data, n, &opts, &res, &err), 0, "%s", err.msg);
  if (nfiles) *nfiles = res.nfiles;
  for (size_t i = 0; i < n; i++) free((void *)data[i]);
  free(data);
}

static shardd_ckpt *open_ok(const char *path) {
  shardd_ckpt *c = NULL;
  int rc = shardd_ckpt_open(path, &c);
  cr_assert_eq(rc, 0, "%s", shardd_last_error(NULL));
  cr_assert_not_null(c);
  return c;
}

/* ------------------------------------------------------------------------ *
 * Round trips
 * ------------------------------------------------------------------------ */

Test(load, every_dtype_round_trips_across_shards) {
  sd_tensor t[SD_DT__COUNT];
  char names[SD_DT__COUNT][32];
  for (int d = 0; d < SD_DT__COUNT; d++) {
    snprintf(names[d], sizeof names[d], "t.%s", sd_dtype_name((sd_dtype)d));
    t[d] = (sd_tensor){.name = names[d], .dtype = (sd_dtype)d, .ndim = 2, .index = d};
    t[d].shape[0] = 3;
    t[d].shape[1] = 5 + (uint64_t)d;
  }
  size_t nfiles = 0;
  write_ckpt(t, SD_DT__COUNT, 300, &nfiles);
  cr_assert_gt(nfiles, 1, "the test wants an index and several shards");

  shardd_ckpt *c = open_ok(ckdir);
  cr_assert_eq(shardd_ckpt_count(c), (size_t)SD_DT__COUNT);
  for (int d = 0; d < SD_DT__COUNT; d++) {
    size_t i;
    cr_assert_eq(shardd_ckpt_find(c, names[d], &i), 0, "%s", shardd_last_error(NULL));
    shardd_tensor_info info;
    cr_assert_eq(shardd_ckpt_tensor(c, i, &info), 0);
    cr_assert_str_eq(info.name, names[d]);
    cr_assert_str_eq(info.dtype, sd_dtype_name((sd_dtype)d));
    cr_assert_eq(info.ndim, 2);
    cr_assert_eq(info.shape[0], 3);
    cr_assert_eq(info.shape[1], 5 + (uint64_t)d);
    uint64_t nb = 3 * (5 + (uint64_t)d) * sd_dtype_size((sd_dtype)d);
    cr_assert_eq(info.nbytes, nb);
    cr_assert(strstr(info.file, "model-0000") == info.file, "file %s", info.file);
    unsigned char *buf = malloc(nb);
    cr_assert_eq(shardd_ckpt_read(c, names[d], NULL, NULL, buf, nb), 0, "%s", shardd_last_error(NULL));
    for (uint64_t k = 0; k < nb; k++) cr_assert_eq(buf[k], pattern((size_t)d, k), "%s byte %" PRIu64, names[d], k);
    free(buf);
  }
  /* Listed in name order. */
  shardd_tensor_info a, b;
  for (size_t i = 1; i < shardd_ckpt_count(c); i++) {
    shardd_ckpt_tensor(c, i - 1, &a);
    shardd_ckpt_tensor(c, i, &b);
    cr_assert_lt(strcmp(a.name, b.name), 0);
  }
  shardd_ckpt_close(c);
}

Test(load, single_file_by_folder_and_by_path) {
  sd_tensor t[2] = {{.name = "w", .dtype = SD_DT_F32, .ndim = 1, .shape = {6}, .index = 0},
                    {.name = "s", .dtype = SD_DT_I64, .ndim = 0, .index = 1}};
  write_ckpt(t, 2, 0, NULL);
  char file[200];
  snprintf(file, sizeof file, "%s/model.safetensors", ckdir);
  const char *paths[] = {ckdir, file};
  for (int p = 0; p < 2; p++) {
    shardd_ckpt *c = open_ok(paths[p]);
    cr_assert_eq(shardd_ckpt_count(c), 2);
    unsigned char s[8];
    cr_assert_eq(shardd_ckpt_read(c, "s", NULL, NULL, s, 8), 0, "%s", shardd_last_error(NULL));
    for (int k = 0; k < 8; k++) cr_assert_eq(s[k], pattern(1, (uint64_t)k));
    shardd_tensor_info info;
    size_t i;
    cr_assert_eq(shardd_ckpt_find(c, "s", &i), 0);
    shardd_ckpt_tensor(c, i, &info);
    cr_assert_eq(info.ndim, 0);
    cr_assert_str_eq(info.file, "model.safetensors");
    shardd_ckpt_close(c);
  }
}

/* ------------------------------------------------------------------------ *
 * Boxes
 * ------------------------------------------------------------------------ */

static uint64_t rng(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ULL;
}

/* Reads every kind of box (whole, one dimension cut, several cut, single
 * elements, empty) and checks each element against its row-major index. */
static void check_boxes(shardd_ckpt *c, const char *name, size_t tensor, uint32_t ndim,
                        const uint64_t *shape, unsigned esz, uint64_t seed) {
  uint64_t s = seed;
  for (int trial = 0; trial < 300; trial++) {
    uint64_t start[SD_MAX_DIMS], count[SD_MAX_DIMS], numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
      uint64_t kind = rng(&s) % 4;
      if (kind == 0) { /* whole dimension */
        start[d] = 0;
        count[d] = shape[d];
      } else {
        start[d] = rng(&s) % (shape[d] + 1);
        count[d] = rng(&s) % (shape[d] - start[d] + 1);
        if (kind == 3 && start[d] < shape[d]) count[d] = 1;
      }
      numel *= count[d];
    }
    size_t len = (size_t)(numel * esz);
    unsigned char *buf = malloc(len ? len : 1);
    cr_assert_eq(shardd_ckpt_read(c, name, start, count, buf, len), 0, "%s", shardd_last_error(NULL));
    uint64_t ctr[SD_MAX_DIMS] = {0};
    for (uint64_t e = 0; e < numel; e++) {
      uint64_t flat = 0;
      for (uint32_t d = 0; d < ndim; d++) flat = flat * shape[d] + start[d] + ctr[d];
      for (unsigned b = 0; b < esz; b++)
        cr_assert_eq(buf[e * esz + b], pattern(tensor, flat * esz + b), "trial %d element %" PRIu64,
                     trial, e);
      for (uint32_t d = ndim; d-- > 0;) {
        if (++ctr[d] < count[d]) break;
        ctr[d] = 0;
      }
    }
    free(buf);
  }
}

Test(load, boxes_of_every_rank_match_index_arithmetic) {
  sd_tensor t[5] = {
      {.name = "r1", .dtype = SD_DT_F32, .ndim = 1, .shape = {17}, .index = 0},
      {.name = "r2", .dtype = SD_DT_BF16, .ndim = 2, .shape = {7, 9}, .index = 1},
      {.name = "r3", .dtype = SD_DT_U8, .ndim = 3, .shape = {4, 5, 6}, .index = 2},
      {.name = "r4", .dtype = SD_DT_F64, .ndim = 4, .shape = {3, 4, 2, 5}, .index = 3},
      {.name = "r5", .dtype = SD_DT_I16, .ndim = 5, .shape = {2, 3, 1, 4, 3}, .index = 4},
  };
  write_ckpt(t, 5, 0, NULL);
  shardd_ckpt *c = open_ok(ckdir);
  for (size_t i = 0; i < 5; i++)
    check_boxes(c, t[i].name, i, t[i].ndim, t[i].shape, sd_dtype_size(t[i].dtype), 0x9e3779b97f4a7c15ULL + i);
  shardd_ckpt_close(c);
}

/* The bytes read from the file are the box's, not the tensor's. */
static uint64_t rchar(void) {
  FILE *f = fopen("/proc/self/io", "r");
  cr_assert_not_null(f);
  char line[128];
  uint64_t v = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "rchar: %" SCNu64, &v) == 1) break;
  fclose(f);
  return v;
}

Test(load, reads_only_the_box) {
  sd_tensor t = {.name = "big", .dtype = SD_DT_F32, .ndim = 2, .shape = {1024, 1024}, .index = 0};
  write_ckpt(&t, 1, 0, NULL);
  shardd_ckpt *c = open_ok(ckdir);
  uint64_t start[2] = {256, 0}, count[2] = {4, 1024};
  static unsigned char buf[4 * 1024 * 4];
  uint64_t before = rchar();
  cr_assert_eq(shardd_ckpt_read(c, "big", start, count, buf, sizeof buf), 0);
  uint64_t read = rchar() - before;
  shardd_ckpt_close(c);
  /* The /proc read itself adds a few hundred bytes. */
  cr_assert(read >= sizeof buf && read < sizeof buf + 4096, "read %" PRIu64 " bytes for a %zu-byte box",
            read, sizeof buf);
}

/* ------------------------------------------------------------------------ *
 * Refusals
 * ------------------------------------------------------------------------ */

static void expect_open_fails(const char *path, int code, const char *frag) {
  shardd_ckpt *c = (shardd_ckpt *)1;
  int rc = shardd_ckpt_open(path, &c);
  cr_assert_eq(rc, code, "rc %d (%s)", rc, shardd_last_error(NULL));
  cr_assert_null(c);
  cr_assert(strstr(shardd_last_error(NULL), frag), "message: %s", shardd_last_error(NULL));
}

static void write_file(const char *name, const void *b, size_t len) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", ckdir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, b, len), (ssize_t)len);
  close(fd);
}

/* A hand-written file: the 8-byte length, the JSON, then data bytes. */
static void write_st(const char *name, const char *json, size_t ndata) {
  size_t hl = strlen(json), len = 8 + hl + ndata;
  unsigned char *b = calloc(1, len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, json, hl);
  write_file(name, b, len);
  free(b);
}

Test(load, hostile_files_refused_with_the_readers_codes) {
  expect_open_fails(ckdir, SHARDD_E_IO, "cannot open");
  cr_assert_eq(mkdir(ckdir, 0755), 0);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "no .safetensors file and no index");
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "tensor 'w': data_offsets [0,10] but F32[3] needs 12 bytes");
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 8);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "run past the end of the file");
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 13);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "trailing byte");
  write_file("model.safetensors", "\xff\xff\xff\xff\0\0\0\0{}", 10);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "header length");
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1);
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "tensor 'w'");
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  static const char ix[] =
      "{\"metadata\":{\"total_size\":4},\"weight_map\":{\"w\":\"model-00001-of-00002.safetensors\"}}";
  write_file("model.safetensors.index.json", ix, strlen(ix));
  expect_open_fails(ckdir, SHARDD_E_FILE_SET, "model-00001-of-00002.safetensors, which does not exist");
  /* the index gone, the shard left: refused too, not read as a single-file checkpoint */
  int dfd = open(ckdir, O_RDONLY | O_DIRECTORY);
  cr_assert_eq(unlinkat(dfd, "model.safetensors.index.json", 0), 0);
  cr_assert_eq(renameat(dfd, "model.safetensors", dfd, "model-00001-of-00002.safetensors"), 0);
  close(dfd);
  expect_open_fails(ckdir, SHARDD_E_FILE_SET, "model.safetensors.index.json is missing");
  /* a stale shard beside a single-file checkpoint */
  write_st("model.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_open_fails(ckdir, SHARDD_E_FILE_SET, "model-00001-of-00002.safetensors: a shard file beside");
}

Test(load, bad_reads_refused_naming_the_tensor) {
  sd_tensor t = {.name = "w", .dtype = SD_DT_F32, .ndim = 2, .shape = {4, 6}, .index = 0};
  write_ckpt(&t, 1, 0, NULL);
  shardd_ckpt *c = open_ok(ckdir);
  unsigned char buf[96];
  cr_assert_eq(shardd_ckpt_read(c, "nope", NULL, NULL, buf, 96), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "'nope' is not in the checkpoint"), "%s", shardd_last_error(NULL));
  size_t i;
  cr_assert_eq(shardd_ckpt_find(c, "nope", &i), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_eq(shardd_ckpt_read(c, "w", NULL, NULL, buf, 95), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "holds 96 bytes but the buffer has 95"), "%s", shardd_last_error(NULL));
  uint64_t start[2] = {3, 0}, count[2] = {2, 6};
  cr_assert_eq(shardd_ckpt_read(c, "w", start, count, buf, 48), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "tensor 'w'"), "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_ckpt_read(c, "w", start, NULL, buf, 48), SHARDD_E_INVALID_ARGUMENT);
  shardd_tensor_info info;
  cr_assert_eq(shardd_ckpt_tensor(c, 1, &info), SHARDD_E_INVALID_ARGUMENT);

  /* Truncated after it was checked: an I/O error, never bytes from past the end. */
  char file[200];
  snprintf(file, sizeof file, "%s/model.safetensors", ckdir);
  struct stat st;
  cr_assert_eq(stat(file, &st), 0);
  cr_assert_eq(truncate(file, st.st_size - 8), 0);
  cr_assert_eq(shardd_ckpt_read(c, "w", NULL, NULL, buf, 96), SHARDD_E_IO);
  cr_assert(strstr(shardd_last_error(NULL), "shorter than its header says"), "%s", shardd_last_error(NULL));
  shardd_ckpt_close(c);
  /* And reopening it is refused by the strict reader. */
  expect_open_fails(ckdir, SHARDD_E_FORMAT, "past the end");
}

/* ------------------------------------------------------------------------ *
 * The deep check of the files the library checked
 * ------------------------------------------------------------------------ */

/* name: tensor w, 100 zero bytes of data, and their CRC-32C in __metadata__; json and hex get
 * the header and the recorded value. */
static void write_checksummed(const char *name, char json[256], char hex[SD_CHECKSUM_HEX + 1]) {
  unsigned char zeros[100] = {0};
  sd_crc32c_hex(sd_crc32c(0, zeros, sizeof zeros), hex);
  snprintf(json, 256,
           "{\"__metadata__\":{\"" SD_CHECKSUM_KEY "\":\"%s\"},\"w\":{\"dtype\":\"U8\",\"shape\":[100],"
           "\"data_offsets\":[0,100]}}",
           hex);
  write_st(name, json, sizeof zeros);
}

Test(load, verify_compares_the_recorded_checksum_of_the_checked_files) {
  cr_assert_eq(mkdir(ckdir, 0755), 0);
  char json[256], hex[SD_CHECKSUM_HEX + 1];
  write_checksummed("model.safetensors", json, hex);
  shardd_ckpt *c = open_ok(ckdir);
  cr_assert_eq(shardd_ckpt_verify(c), 0, "%s", shardd_last_error(NULL));
  /* Changed in place after the open: the same file, so the change is seen. */
  char file[200];
  snprintf(file, sizeof file, "%s/model.safetensors", ckdir);
  int fd = open(file, O_WRONLY);
  cr_assert_eq(pwrite(fd, "x", 1, 8 + (off_t)strlen(json) + 50), 1);
  close(fd);
  cr_assert_eq(shardd_ckpt_verify(c), SHARDD_E_CHECKSUM);
  char want[128];
  snprintf(want, sizeof want, "but its __metadata__ records %s", hex);
  cr_assert(strstr(shardd_last_error(NULL), "bad_checksum: model.safetensors: data CRC-32C is "), "%s",
            shardd_last_error(NULL));
  cr_assert(strstr(shardd_last_error(NULL), want), "%s", shardd_last_error(NULL));
  cr_assert_eq(truncate(file, 8 + (off_t)strlen(json) + 10), 0);
  cr_assert_eq(shardd_ckpt_verify(c), SHARDD_E_FORMAT);
  cr_assert(strstr(shardd_last_error(NULL), "model.safetensors: truncated: "), "%s", shardd_last_error(NULL));
  shardd_ckpt_close(c);
  cr_assert_eq(shardd_ckpt_verify(NULL), SHARDD_E_INVALID_ARGUMENT);
}

Test(load, verify_without_recorded_checksums_is_an_error) {
  /* The sync writer records none: nothing to compare with is an error, not a pass. */
  sd_tensor t[2] = {{.name = "a", .dtype = SD_DT_F32, .ndim = 1, .shape = {5000}, .index = 0},
                    {.name = "b", .dtype = SD_DT_F32, .ndim = 1, .shape = {5000}, .index = 1}};
  size_t nfiles = 0;
  write_ckpt(t, 2, 20000, &nfiles);
  cr_assert_eq(nfiles, 2);
  shardd_ckpt *c = open_ok(ckdir);
  cr_assert_eq(shardd_ckpt_verify(c), SHARDD_E_CHECKSUM);
  cr_assert(strstr(shardd_last_error(NULL),
                   "model.safetensors.index.json records no checksums (written without them, or not by shardd)"),
            "%s", shardd_last_error(NULL));
  shardd_ckpt_close(c);
}

/* ------------------------------------------------------------------------ *
 * Files opened on demand: any number of shards within the descriptor limit
 * ------------------------------------------------------------------------ */

#define MANY_FILES 3000

Test(load, thousands_of_files_load_under_a_low_descriptor_limit) {
  sd_tensor *t = calloc(MANY_FILES, sizeof *t);
  char(*names)[16] = calloc(MANY_FILES, sizeof *names);
  for (size_t i = 0; i < MANY_FILES; i++) {
    snprintf(names[i], sizeof names[i], "t%05zu", i);
    t[i] = (sd_tensor){.name = names[i], .dtype = SD_DT_U8, .ndim = 1, .shape = {3 + i % 5}, .index = (uint32_t)i};
  }
  size_t nfiles = 0;
  write_ckpt(t, MANY_FILES, 4, &nfiles); /* a shard per tensor */
  cr_assert_eq(nfiles, MANY_FILES);
  /* Far fewer descriptors than files: the reader held one per shard and failed with EMFILE. */
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = 256;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  shardd_ckpt *c = open_ok(ckdir);
  cr_assert_eq(shardd_ckpt_count(c), (size_t)MANY_FILES);
  unsigned char buf[8];
  for (size_t i = 0; i < MANY_FILES; i++) {
    size_t n = 3 + i % 5;
    cr_assert_eq(shardd_ckpt_read(c, names[i], NULL, NULL, buf, n), 0, "%s", shardd_last_error(NULL));
    for (size_t k = 0; k < n; k++) cr_assert_eq(buf[k], pattern(i, k), "%s byte %zu", names[i], k);
  }
  /* The deep check opens them one at a time too (this writer records no checksums: refused as such). */
  cr_assert_eq(shardd_ckpt_verify(c), SHARDD_E_CHECKSUM, "%s", shardd_last_error(NULL));
  shardd_ckpt_close(c);
  free(names);
  free(t);
}

Test(load, a_file_swapped_in_after_the_open_is_refused_by_reads_and_verify) {
  cr_assert_eq(mkdir(ckdir, 0755), 0);
  char json[256], hex[SD_CHECKSUM_HEX + 1];
  write_checksummed("model.safetensors", json, hex);
  shardd_ckpt *c = open_ok(ckdir);
  unsigned char buf[100];
  cr_assert_eq(shardd_ckpt_read(c, "w", NULL, NULL, buf, sizeof buf), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_ckpt_verify(c), 0, "%s", shardd_last_error(NULL));
  /* The same bytes under the same name, but another file: not the one whose header was checked. */
  write_checksummed("other", json, hex);
  char from[256], to[256];
  path_of(from, sizeof from, "other");
  path_of(to, sizeof to, "model.safetensors");
  cr_assert_eq(rename(from, to), 0);
  cr_assert_eq(shardd_ckpt_read(c, "w", NULL, NULL, buf, sizeof buf), SHARDD_E_FORMAT);
  cr_assert(strstr(shardd_last_error(NULL), "model.safetensors: replaced by another file since the checkpoint was opened"),
            "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_ckpt_verify(c), SHARDD_E_FORMAT);
  cr_assert(strstr(shardd_last_error(NULL), "model.safetensors: replaced by another file"), "%s",
            shardd_last_error(NULL));
  shardd_ckpt_close(c);
}
