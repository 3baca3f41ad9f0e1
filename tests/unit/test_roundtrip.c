/* Randomized round trips: the synchronous writer's checkpoints pass the strict reader and give back the bytes given. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_reader.h"
#include "sd_writer_sync.h"

static char tmpdir[64];

static void mk_tmp(void) {
  strcpy(tmpdir, "/tmp/shardd-test-roundtrip-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(roundtrip, .init = mk_tmp, .fini = rm_tmp);

/* ------------------------------------------------------------------------ *
 * A random state dict
 * ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
  /* xorshift64*: reproducible from the seed printed on failure. */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ULL;
}

static uint64_t rng_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }

typedef struct {
  size_t n;
  sd_tensor *t;
  char **names;
  unsigned char **data;
  uint64_t *nbytes;
  uint64_t total;
  uint64_t params;
} dict;

static void dict_random(dict *d, uint64_t *s) {
  d->n = 1 + rng_below(s, 40);
  d->t = calloc(d->n, sizeof *d->t);
  d->names = calloc(d->n, sizeof *d->names);
  d->data = calloc(d->n, sizeof *d->data);
  d->nbytes = calloc(d->n, sizeof *d->nbytes);
  d->total = d->params = 0;
  static const char *kinds[] = {"weight", "bias", "norm", "embed_tokens.weight", "q_proj"};
  for (size_t i = 0; i < d->n; i++) {
    char name[96];
    /* Unique by the trailing index; layer numbers exercise natural order. */
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".%s.%zu", rng_below(s, 30),
             kinds[rng_below(s, 5)], i);
    d->names[i] = strdup(name);
    sd_tensor *t = &d->t[i];
    t->name = d->names[i];
    t->dtype = (sd_dtype)rng_below(s, SD_DT__COUNT);
    t->ndim = (uint32_t)rng_below(s, 5);
    t->index = -1;
    uint64_t numel = 1;
    for (uint32_t k = 0; k < t->ndim; k++) {
      uint64_t r = rng_below(s, 20);
      t->shape[k] = r == 0 ? 0 : r < 17 ? 1 + rng_below(s, 6) : 1 + rng_below(s, 64);
      numel *= t->shape[k];
    }
    d->nbytes[i] = numel * sd_dtype_size(t->dtype);
    d->total += d->nbytes[i];
    d->params += numel;
    if (d->nbytes[i]) {
      d->data[i] = malloc(d->nbytes[i]);
      for (uint64_t b = 0; b < d->nbytes[i]; b++) d->data[i][b] = (unsigned char)rng_next(s);
    }
  }
}

static void dict_free(dict *d) {
  for (size_t i = 0; i < d->n; i++) {
    free(d->names[i]);
    free(d->data[i]);
  }
  free(d->t);
  free(d->names);
  free(d->data);
  free(d->nbytes);
}

/* ------------------------------------------------------------------------ *
 * What must hold for every checkpoint written
 * ------------------------------------------------------------------------ */

static int read_at(const char *path, uint64_t off, unsigned char *buf, uint64_t len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t r = pread(fd, buf, len, (off_t)off);
  close(fd);
  return r == (ssize_t)len ? 0 : -1;
}

static void check_checkpoint(const char *dir, const dict *d, const sd_plan_opts *o,
                             const sd_write_result *wr, uint64_t seed) {
  sd_ckpt c;
  sd_error err;
  int rc = sd_ckpt_read(dir, &c, &err);
  cr_assert_eq(rc, 0, "seed %" PRIu64 ": reader refused: %s", seed, err.msg);
  const char *prefix = o->prefix ? o->prefix : "model";
  uint64_t max = o->max_shard_size ? o->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;

  cr_assert_eq(c.ntensors, d->n, "seed %" PRIu64, seed);
  cr_assert_eq(c.total_size, d->total, "seed %" PRIu64, seed);
  cr_assert_eq(c.total_parameters, d->params, "seed %" PRIu64, seed);
  cr_assert_eq(c.nfiles, wr->nfiles, "seed %" PRIu64, seed);
  cr_assert_eq(wr->tensor_bytes, d->total, "seed %" PRIu64, seed);
  cr_assert_str_eq(c.prefix, prefix);

  char want[256];
  if (c.nfiles == 1) {
    cr_assert_null(c.index_name, "seed %" PRIu64 ": a single shard has no index", seed);
    snprintf(want, sizeof want, "%s.safetensors", prefix);
    cr_assert_str_eq(c.files[0].name, want, "seed %" PRIu64, seed);
  } else {
    snprintf(want, sizeof want, "%s.safetensors.index.json", prefix);
    cr_assert_not_null(c.index_name, "seed %" PRIu64, seed);
    cr_assert_str_eq(c.index_name, want, "seed %" PRIu64, seed);
    for (size_t f = 0; f < c.nfiles; f++) {
      snprintf(want, sizeof want, "%s-%05zu-of-%05zu.safetensors", prefix, f + 1, c.nfiles);
      cr_assert_str_eq(c.files[f].name, want, "seed %" PRIu64, seed);
    }
  }

  uint64_t file_bytes = 0;
  for (size_t f = 0; f < c.nfiles; f++) {
    const sd_st_header *h = &c.files[f].h;
    file_bytes += h->file_size;
    cr_assert_eq(h->data_start % 8, 0, "seed %" PRIu64 ": data not 8-aligned", seed);
    size_t nonempty = 0;
    for (size_t t = 0; t < h->ntensors; t++) {
      nonempty += h->tensors[t].end > h->tensors[t].begin;
      cr_assert_eq(h->tensors[t].begin % sd_dtype_size(h->tensors[t].dtype), 0,
                   "seed %" PRIu64 ": tensor '%s' not aligned to its element size", seed,
                   h->tensors[t].name);
    }
    cr_assert(h->data_size <= max || nonempty <= 1,
              "seed %" PRIu64 ": %s holds %" PRIu64 " bytes in %zu tensors, limit %" PRIu64, seed,
              c.files[f].name, h->data_size, nonempty, max);
    /* "format":"pt" always, plus the caller's pairs ("format" forced). */
    int has_pt = 0;
    for (size_t m = 0; m < h->nmeta; m++)
      if (!strcmp(h->meta[m].key, "format")) has_pt = !strcmp(h->meta[m].value, "pt");
    cr_assert(has_pt, "seed %" PRIu64 ": %s lacks format=pt", seed, c.files[f].name);
    for (size_t m = 0; m < o->nmetadata; m++) {
      if (!strcmp(o->metadata[m].key, "format")) continue;
      int found = 0;
      for (size_t k = 0; k < h->nmeta; k++)
        found |= !strcmp(h->meta[k].key, o->metadata[m].key) &&
                 !strcmp(h->meta[k].value, o->metadata[m].value);
      cr_assert(found, "seed %" PRIu64 ": metadata '%s' missing", seed, o->metadata[m].key);
    }
  }
  if (c.index_name) {
    struct stat st;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, c.index_name);
    cr_assert_eq(stat(path, &st), 0);
    file_bytes += (uint64_t)st.st_size;
  }
  cr_assert_eq(wr->file_bytes, file_bytes, "seed %" PRIu64, seed);

  /* Every tensor in exactly one file, as given, with its bytes intact. */
  for (size_t i = 0; i < d->n; i++) {
    const sd_st_tensor *found = NULL;
    size_t where = 0, copies = 0;
    for (size_t f = 0; f < c.nfiles; f++) {
      const sd_st_tensor *t = sd_st_find(&c.files[f].h, d->names[i]);
      if (t) {
        found = t;
        where = f;
        copies++;
      }
    }
    cr_assert_eq(copies, 1, "seed %" PRIu64 ": tensor '%s' in %zu files", seed, d->names[i],
                 copies);
    cr_assert_eq(found->dtype, d->t[i].dtype);
    cr_assert_eq(found->ndim, d->t[i].ndim);
    for (uint32_t k = 0; k < found->ndim; k++) cr_assert_eq(found->shape[k], d->t[i].shape[k]);
    cr_assert_eq(found->end - found->begin, d->nbytes[i]);
    if (d->nbytes[i]) {
      unsigned char *back = malloc(d->nbytes[i]);
      char path[512];
      snprintf(path, sizeof path, "%s/%s", dir, c.files[where].name);
      cr_assert_eq(read_at(path, c.files[where].h.data_start + found->begin, back, d->nbytes[i]),
                   0);
      cr_assert_eq(memcmp(back, d->data[i], d->nbytes[i]), 0,
                   "seed %" PRIu64 ": tensor '%s' bytes differ", seed, d->names[i]);
      free(back);
    }
  }
  sd_ckpt_free(&c);
}

/* ------------------------------------------------------------------------ *
 * Tests
 * ------------------------------------------------------------------------ */

Test(roundtrip, random_state_dicts) {
  static const char *prefixes[] = {NULL, "model", "adapter_model", "pytorch_model"};
  static const sd_kv meta[] = {{"format", "tf"}, {"step", "1000"}, {"note", "h\xc3\xa9llo \"q\""}};
  size_t single = 0, multi = 0, huge_files = 0;
  for (uint64_t it = 0; it < 150; it++) {
    uint64_t seed = 0x9e3779b97f4a7c15ULL * (it + 1), s = seed;
    dict d;
    dict_random(&d, &s);
    sd_plan_opts o;
    memset(&o, 0, sizeof o);
    uint64_t r = rng_below(&s, 10);
    /* Limits from "everything in one tensor per file" to "all in one file". */
    o.max_shard_size = r == 0 ? 0 : 1 + rng_below(&s, d.total + d.total / 2 + 1);
    o.prefix = prefixes[rng_below(&s, 4)];
    o.metadata = meta + rng_below(&s, 3);
    o.nmetadata = (size_t)(meta + 3 - o.metadata) - rng_below(&s, 2);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ck%" PRIu64, tmpdir, it);
    sd_write_result wr;
    sd_error err;
    int rc = sd_write_checkpoint_sync(dir, d.t, (const void *const *)d.data, d.n, &o, &wr, &err);
    cr_assert_eq(rc, 0, "seed %" PRIu64 ": writer failed: %s", seed, err.msg);
    check_checkpoint(dir, &d, &o, &wr, seed);
    single += wr.nfiles == 1;
    multi += wr.nfiles > 1;
    huge_files += wr.nfiles > 10;
    dict_free(&d);
  }
  /* The generator must actually reach both layouts for the test to mean anything. */
  cr_assert_gt(single, 10);
  cr_assert_gt(multi, 10);
  cr_assert_gt(huge_files, 0);
}

Test(roundtrip, one_tensor_per_file_and_oversized_tensors) {
  uint64_t s = 42;
  dict d;
  dict_random(&d, &s);
  sd_plan_opts o;
  memset(&o, 0, sizeof o);
  o.max_shard_size = 1;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/tiny", tmpdir);
  sd_write_result wr;
  sd_error err;
  cr_assert_eq(sd_write_checkpoint_sync(dir, d.t, (const void *const *)d.data, d.n, &o, &wr, &err),
               0, "%s", err.msg);
  check_checkpoint(dir, &d, &o, &wr, 42);
  dict_free(&d);
}

Test(roundtrip, scalars_and_empty_tensors_only) {
  static const uint64_t zero_shape[] = {3, 0, 5};
  sd_tensor t[3];
  memset(t, 0, sizeof t);
  t[0] = (sd_tensor){.name = "scalar", .dtype = SD_DT_F64, .ndim = 0, .index = -1};
  t[1] = (sd_tensor){.name = "empty", .dtype = SD_DT_BF16, .ndim = 3, .index = -1};
  memcpy(t[1].shape, zero_shape, sizeof zero_shape);
  t[2] = (sd_tensor){.name = "flag", .dtype = SD_DT_BOOL, .ndim = 1, .index = -1};
  t[2].shape[0] = 1;
  const double pi = 3.25;
  const unsigned char yes = 1;
  const void *data[3] = {&pi, NULL, &yes};
  char dir[128];
  snprintf(dir, sizeof dir, "%s/small", tmpdir);
  sd_write_result wr;
  sd_error err;
  cr_assert_eq(sd_write_checkpoint_sync(dir, t, data, 3, NULL, &wr, &err), 0, "%s", err.msg);
  cr_assert_eq(wr.nfiles, 1);
  cr_assert_eq(wr.tensor_bytes, 9);
  sd_ckpt c;
  cr_assert_eq(sd_ckpt_read(dir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(c.ntensors, 3);
  cr_assert_eq(c.total_parameters, 2);
  const sd_st_tensor *e = sd_st_find(&c.files[0].h, "empty");
  cr_assert_not_null(e);
  cr_assert_eq(e->begin, e->end);
  cr_assert_eq(e->shape[2], 5);
  sd_ckpt_free(&c);
}

Test(roundtrip, refuses_existing_destination_and_leaves_it_alone) {
  sd_tensor t = {.name = "w", .dtype = SD_DT_U8, .ndim = 1, .shape = {4}, .index = -1};
  const unsigned char bytes[4] = {1, 2, 3, 4};
  const void *data[1] = {bytes};
  char dir[128], marker[160];
  snprintf(dir, sizeof dir, "%s/there", tmpdir);
  cr_assert_eq(mkdir(dir, 0755), 0);
  snprintf(marker, sizeof marker, "%s/keep", dir);
  FILE *f = fopen(marker, "w");
  cr_assert_not_null(f);
  fclose(f);
  sd_error err;
  cr_assert_eq(sd_write_checkpoint_sync(dir, &t, data, 1, NULL, NULL, &err), SHARDD_E_EXISTS);
  cr_assert_not_null(strstr(err.msg, "already exists"), "%s", err.msg);
  struct stat st;
  cr_assert_eq(stat(marker, &st), 0, "the existing folder was touched");
}

Test(roundtrip, missing_parent_and_missing_data) {
  sd_tensor t = {.name = "w", .dtype = SD_DT_U8, .ndim = 1, .shape = {4}, .index = -1};
  const void *data[1] = {NULL};
  char dir[128];
  snprintf(dir, sizeof dir, "%s/no/such", tmpdir);
  const unsigned char bytes[4] = {1, 2, 3, 4};
  const void *ok[1] = {bytes};
  sd_error err;
  cr_assert_eq(sd_write_checkpoint_sync(dir, &t, ok, 1, NULL, NULL, &err), SHARDD_E_IO);
  cr_assert_not_null(strstr(err.msg, "cannot create"), "%s", err.msg);
  snprintf(dir, sizeof dir, "%s/nodata", tmpdir);
  cr_assert_eq(sd_write_checkpoint_sync(dir, &t, data, 1, NULL, NULL, &err),
               SHARDD_E_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "tensor 'w': no data given for 4 bytes"), "%s", err.msg);
  struct stat st;
  cr_assert_neq(stat(dir, &st), 0, "nothing may be created when the input is refused");
}

Test(roundtrip, planner_errors_pass_through) {
  sd_tensor t[2] = {{.name = "w", .dtype = SD_DT_U8, .ndim = 1, .shape = {1}, .index = -1},
                    {.name = "w", .dtype = SD_DT_U8, .ndim = 1, .shape = {1}, .index = -1}};
  const unsigned char b = 7;
  const void *data[2] = {&b, &b};
  char dir[128];
  snprintf(dir, sizeof dir, "%s/dup", tmpdir);
  sd_error err;
  sd_error_clear(&err);
  int rc = sd_write_checkpoint_sync(dir, t, data, 2, NULL, NULL, &err);
  cr_assert_lt(rc, 0);
  cr_assert_eq(err.code, rc);
  cr_assert_not_null(strstr(err.msg, "'w'"), "%s", err.msg);
  struct stat st;
  cr_assert_neq(stat(dir, &st), 0);
}
