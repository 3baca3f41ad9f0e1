/* Slice layouts through a real daemon: uneven and inner splits, replicas, scalars, empty tensors, every dtype, inline puts, files. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

TestSuite(layout, .init = h_setup, .fini = h_teardown, .timeout = 100);

#define BOX2(r, nm, dt, s0, s1, a0, a1, c0, c1)                                                          \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}}
#define BOX3(r, nm, dt, s0, s1, s2, a0, a1, a2, c0, c1, c2)                                              \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 3, .shape = {(s0), (s1), (s2)}, .boxed = 1,          \
   .start = {(a0), (a1), (a2)}, .count = {(c0), (c1), (c2)}}

/* ------------------------------------------------------------------------ *
 * Splits
 * ------------------------------------------------------------------------ */
Test(layout, uneven_dim0_and_dim1_splits) {
  static const h_put puts[] = {
      /* rows 3 + 4 + 3 */
      BOX2(0, "a.rows", "F32", 10, 6, 0, 0, 3, 6),
      BOX2(1, "a.rows", "F32", 10, 6, 3, 0, 4, 6),
      BOX2(2, "a.rows", "F32", 10, 6, 7, 0, 3, 6),
      /* columns 2 + 7 + 2 (one row per run in the file) */
      BOX2(0, "b.cols", "BF16", 5, 11, 0, 0, 5, 2),
      BOX2(1, "b.cols", "BF16", 5, 11, 0, 2, 5, 7),
      BOX2(2, "b.cols", "BF16", 5, 11, 0, 9, 5, 2),
      /* uneven in both dimensions at once */
      BOX2(0, "c.blocks", "I32", 7, 5, 0, 0, 4, 5),
      BOX2(1, "c.blocks", "I32", 7, 5, 4, 0, 3, 2),
      BOX2(2, "c.blocks", "I32", 7, 5, 4, 2, 3, 3),
      /* one rank holds a single row, another all the rest, the third nothing of it */
      BOX2(2, "d.lopsided", "F64", 9, 3, 0, 0, 1, 3),
      BOX2(0, "d.lopsided", "F64", 9, 3, 1, 0, 8, 3),
  };
  h_script s = {.opts = {.save = "uneven", .dir = "ck/uneven", .world_size = 3},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 11};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_eq(s.sh->r[0].res.tensors, 4);
  h_shared_free(s.sh);
}

Test(layout, three_d_split_on_inner_dimensions) {
  static const h_put puts[] = {
      /* dim 1 of 3, uneven: 2 + 3 + 1 */
      BOX3(0, "x.mid", "F16", 4, 6, 5, 0, 0, 0, 4, 2, 5),
      BOX3(1, "x.mid", "F16", 4, 6, 5, 0, 2, 0, 4, 3, 5),
      BOX3(2, "x.mid", "F16", 4, 6, 5, 0, 5, 0, 4, 1, 5),
      /* the innermost dimension: 3 + 4 bytes per run */
      BOX3(0, "x.inner", "U8", 3, 4, 7, 0, 0, 0, 3, 4, 3),
      BOX3(1, "x.inner", "U8", 3, 4, 7, 0, 0, 3, 3, 4, 4),
      /* split on dims 1 and 2 at once across three ranks */
      BOX3(0, "x.grid", "I16", 2, 5, 6, 0, 0, 0, 2, 5, 2),
      BOX3(1, "x.grid", "I16", 2, 5, 6, 0, 0, 2, 2, 3, 4),
      BOX3(2, "x.grid", "I16", 2, 5, 6, 0, 3, 2, 2, 2, 4),
      /* 4-d, split on dim 2 */
      {.rank = 0, .name = "x.4d", .dtype = "F32", .ndim = 4, .shape = {2, 3, 4, 5}, .boxed = 1,
       .start = {0, 0, 0, 0}, .count = {2, 3, 1, 5}},
      {.rank = 1, .name = "x.4d", .dtype = "F32", .ndim = 4, .shape = {2, 3, 4, 5}, .boxed = 1,
       .start = {0, 0, 1, 0}, .count = {2, 3, 3, 5}},
  };
  h_script s = {.opts = {.save = "inner", .dir = "inner", .world_size = 3},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 12};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Replicas
 * ------------------------------------------------------------------------ */
Test(layout, replicas_on_every_rank) {
  static const h_put puts[] = {
      /* the same whole tensor from all four ranks, through each way of putting */
      {.rank = 0, .name = "norm.weight", .dtype = "F32", .ndim = 1, .shape = {33}, .how = H_ARENA},
      {.rank = 1, .name = "norm.weight", .dtype = "F32", .ndim = 1, .shape = {33}, .how = H_COPY},
      {.rank = 2, .name = "norm.weight", .dtype = "F32", .ndim = 1, .shape = {33}, .how = H_INLINE},
      {.rank = 3, .name = "norm.weight", .dtype = "F32", .ndim = 1, .shape = {33}, .how = H_ARENA},
      /* TP=2 x DP=2: each half comes from two ranks */
      BOX2(0, "proj.weight", "BF16", 9, 4, 0, 0, 4, 4),
      BOX2(1, "proj.weight", "BF16", 9, 4, 4, 0, 5, 4),
      BOX2(2, "proj.weight", "BF16", 9, 4, 0, 0, 4, 4),
      BOX2(3, "proj.weight", "BF16", 9, 4, 4, 0, 5, 4),
      /* a replica given as an explicit full box by every rank */
      {.rank = -1, .name = "bias", .dtype = "F64", .ndim = 1, .shape = {5}, .boxed = 1, .start = {0},
       .count = {5}},
  };
  h_script s = {.opts = {.save = "replicas", .dir = "replicas", .world_size = 4},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 13};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  /* Written once: the data holds each tensor exactly once. */
  sd_ckpt c;
  h_ckpt_read("replicas", &c);
  cr_assert_eq(c.total_size, 33 * 4 + 9 * 4 * 2 + 5 * 8, "replicas must be written once (%llu bytes)",
               (unsigned long long)c.total_size);
  cr_assert_eq(c.nfiles, 1);
  cr_assert_eq(c.files[0].h.data_size, c.total_size);
  sd_ckpt_free(&c);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Scalars and empty tensors
 * ------------------------------------------------------------------------ */
Test(layout, scalars_and_zero_size_tensors) {
  static const float pi = 3.25f;
  static const h_put puts[] = {
      /* 0-d: inline from rank 0, the same scalar from rank 1's arena */
      {.rank = 0, .name = "s.f32", .dtype = "F32", .ndim = 0, .how = H_INLINE, .bytes = &pi, .len = 4},
      {.rank = 1, .name = "s.f32", .dtype = "F32", .ndim = 0, .how = H_ARENA, .bytes = &pi, .len = 4},
      {.rank = 1, .name = "s.i64", .dtype = "I64", .ndim = 0},
      {.rank = 0, .name = "s.bool", .dtype = "BOOL", .ndim = 0, .how = H_INLINE},
      /* zero-size: whole, split, replicated, with an inner zero */
      {.rank = 0, .name = "e.rows", .dtype = "F32", .ndim = 2, .shape = {0, 4}},
      BOX2(0, "e.cols", "BF16", 3, 0, 0, 0, 1, 0),
      BOX2(1, "e.cols", "BF16", 3, 0, 1, 0, 2, 0),
      {.rank = -1, .name = "e.1d", .dtype = "U8", .ndim = 1, .shape = {0}, .how = H_INLINE},
      {.rank = 1, .name = "e.3d", .dtype = "I32", .ndim = 3, .shape = {2, 0, 3}},
      /* something with bytes beside them */
      {.rank = 0, .name = "w", .dtype = "F32", .ndim = 1, .shape = {7}},
  };
  h_script s = {.opts = {.save = "tiny", .dir = "tiny", .world_size = 2},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 14};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  sd_ckpt c;
  h_ckpt_read("tiny", &c);
  const sd_st_tensor *t = h_ckpt_find(&c, "s.f32", NULL);
  cr_assert_eq(t->ndim, 0);
  cr_assert_eq(t->end - t->begin, 4);
  t = h_ckpt_find(&c, "e.3d", NULL);
  cr_assert_eq(t->ndim, 3);
  cr_assert_eq(t->shape[1], 0);
  cr_assert_eq(t->end, t->begin, "a zero-size tensor takes no bytes");
  sd_ckpt_free(&c);
  size_t len;
  uint8_t *b = h_read_tensor("tiny", "s.f32", &len);
  float got;
  memcpy(&got, b, 4);
  cr_assert_eq(got, 3.25f);
  free(b);
  h_shared_free(s.sh);
}

Test(layout, save_with_files_and_no_tensors) {
  static const char cfg[] = "{\"model_type\":\"none\"}";
  const h_file files[] = {{.rank = 0, .path = "config.json", .data = cfg, .len = sizeof cfg - 1}};
  h_script s = {.opts = {.save = "notensors", .dir = "notensors", .world_size = 2}, .files = files,
                .nfiles = 1, .seed = 19};
  h_run(&s);
  /* An empty model.safetensors beside the file, as save_pretrained writes
   * for an empty state dict. */
  h_expect_committed(&s);
  h_verify_ok("notensors");
  sd_ckpt c;
  h_ckpt_read("notensors", &c);
  cr_assert_eq(c.ntensors, 0);
  cr_assert_eq(c.nfiles, 1);
  cr_assert_str_eq(c.files[0].name, "model.safetensors");
  sd_ckpt_free(&c);
  char p[PATH_MAX];
  char *got = h_slurp(h_path(p, sizeof p, "notensors/config.json"), NULL);
  cr_assert_not_null(got);
  cr_assert_str_eq(got, cfg);
  free(got);
  cr_assert_eq(s.sh->r[1].res.files, 2);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Every whole-byte dtype
 * ------------------------------------------------------------------------ */
static const char *const all_dtypes[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                                         "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32",
                                         "F32",  "C64", "F64", "I64", "U64"};
#define NDT (sizeof all_dtypes / sizeof all_dtypes[0])

Test(layout, every_whole_byte_dtype) {
  static char names[NDT][32];
  static h_put puts[NDT * 2 + NDT];
  size_t n = 0;
  for (size_t i = 0; i < NDT; i++) {
    snprintf(names[i], sizeof names[i], "dt.%s", all_dtypes[i]);
    /* rows 2 + 3 from two ranks, plus a scalar of the dtype */
    h_put a = BOX2(0, names[i], all_dtypes[i], 5, 3, 0, 0, 2, 3);
    h_put b = BOX2(1, names[i], all_dtypes[i], 5, 3, 2, 0, 3, 3);
    puts[n++] = a;
    puts[n++] = b;
  }
  static char snames[NDT][32];
  for (size_t i = 0; i < NDT; i++) {
    snprintf(snames[i], sizeof snames[i], "scalar.%s", all_dtypes[i]);
    puts[n++] = (h_put){.rank = (int)(i % 2), .name = snames[i], .dtype = all_dtypes[i], .ndim = 0,
                        .how = i % 3 == 0 ? H_INLINE : H_ARENA};
  }
  h_script s = {.opts = {.save = "dtypes", .dir = "dtypes", .world_size = 2}, .puts = puts, .nputs = n,
                .seed = 15};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s); /* dtype names, shapes, bytes and alignment, per tensor */
  cr_assert_eq(s.sh->r[1].res.tensors, 2 * NDT);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Inline data, prefix and metadata
 * ------------------------------------------------------------------------ */
Test(layout, inline_data_puts_prefix_and_metadata) {
  static const uint8_t row0[6] = {1, 2, 3, 4, 5, 6};      /* U8 [3,4] columns 0..1 */
  static const uint8_t row1[6] = {7, 8, 9, 10, 11, 12};   /* columns 2..3 */
  static const int16_t col[4] = {-1, 300, -32768, 32767}; /* I16 [4] */
  static const h_put puts[] = {
      {.rank = 0, .name = "in.mixed", .dtype = "U8", .ndim = 2, .shape = {3, 4}, .boxed = 1, .start = {0, 0},
       .count = {3, 2}, .how = H_INLINE, .bytes = row0, .len = 6},
      /* the other half of the same tensor from shared memory */
      {.rank = 1, .name = "in.mixed", .dtype = "U8", .ndim = 2, .shape = {3, 4}, .boxed = 1, .start = {0, 2},
       .count = {3, 2}, .how = H_ARENA, .bytes = row1, .len = 6},
      {.rank = 1, .name = "in.whole", .dtype = "I16", .ndim = 1, .shape = {4}, .how = H_INLINE, .bytes = col,
       .len = sizeof col},
      {.rank = 0, .name = "in.synth", .dtype = "BF16", .ndim = 2, .shape = {16, 8}, .how = H_INLINE},
      /* a UTF-8 name survives header, index and read-back */
      {.rank = 1, .name = "emb.\xc3\xbc\xe5\xad\x97.weight", .dtype = "F16", .ndim = 1, .shape = {3},
       .how = H_INLINE},
  };
  static const char *const md[] = {"step", "42", "note", "inline"};
  h_script s = {.opts = {.save = "inline", .dir = "inline", .world_size = 2, .prefix = "custom",
                         .metadata = md, .nmetadata = 2},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 16};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  /* One shard: PREFIX.safetensors and no index, as save_pretrained does. */
  char p[PATH_MAX];
  cr_assert(h_exists(h_path(p, sizeof p, "inline/custom.safetensors")));
  cr_assert(!h_exists(h_path(p, sizeof p, "inline/custom.safetensors.index.json")));
  cr_assert(!h_exists(h_path(p, sizeof p, "inline/model.safetensors")));
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "inline")), 1);
  uint8_t want[12] = {1, 2, 7, 8, 3, 4, 9, 10, 5, 6, 11, 12};
  h_check_bytes("inline", "in.mixed", want, sizeof want);
  /* __metadata__: format pt plus the caller's pairs. */
  sd_ckpt c;
  h_ckpt_read("inline", &c);
  int format = 0, step = 0, note = 0;
  for (size_t i = 0; i < c.files[0].h.nmeta; i++) {
    const sd_st_meta *m = &c.files[0].h.meta[i];
    format |= !strcmp(m->key, "format") && !strcmp(m->value, "pt");
    step |= !strcmp(m->key, "step") && !strcmp(m->value, "42");
    note |= !strcmp(m->key, "note") && !strcmp(m->value, "inline");
  }
  cr_assert(format && step && note, "__metadata__ lacks format=pt or the caller's pairs");
  sd_ckpt_free(&c);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * file artifacts
 * ------------------------------------------------------------------------ */
static void bad_file_paths(const h_script *s, int rank, int point, shardd_client *c) {
  if (point != H_AT_PUTS || rank != 0) return;
  h_result *r = &s->sh->r[rank];
  static const char *const bad[] = {"../escape.json", "sub/config.json", "/abs.json", "..", "."};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = shardd_file(c, s->opts.save, bad[i], "x", 1);
    if (rc != SHARDD_E_BAD_PATH) {
      h_result_fail(r, "badfile", rc ? rc : -999, c);
      return;
    }
  }
}

Test(layout, file_artifacts_beside_the_shards) {
  static const char cfg[] = "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 8\n}\n";
  static const char tok[] = "{\"version\":\"1.0\",\"added_tokens\":[]}";
  static uint8_t bin[3000];
  for (size_t i = 0; i < sizeof bin; i++) bin[i] = (uint8_t)(i * 7 + 3);
  static const h_put puts[] = {
      BOX2(0, "w", "F32", 8, 8, 0, 0, 4, 8),
      BOX2(1, "w", "F32", 8, 8, 4, 0, 4, 8),
      {.rank = 1, .name = "v", .dtype = "F32", .ndim = 1, .shape = {40}},
  };
  const h_file files[] = {
      {.rank = -1, .path = "config.json", .data = cfg, .len = sizeof cfg - 1}, /* same bytes: kept once */
      {.rank = 1, .path = "tokenizer.json", .data = tok, .len = sizeof tok - 1},
      {.rank = 0, .path = "blob.bin", .data = bin, .len = sizeof bin},
      {.rank = 1, .path = "empty.txt", .data = "", .len = 0},
  };
  h_script s = {.opts = {.save = "files", .dir = "files", .world_size = 2, .max_shard_size = 200},
                .puts = puts, .nputs = 3, .files = files, .nfiles = 4, .seed = 17, .hook = bad_file_paths};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  char p[PATH_MAX];
  struct {
    const char *name;
    const void *data;
    size_t len;
  } want[] = {{"config.json", cfg, sizeof cfg - 1},
              {"tokenizer.json", tok, sizeof tok - 1},
              {"blob.bin", bin, sizeof bin},
              {"empty.txt", "", 0}};
  uint64_t total = 0;
  for (size_t i = 0; i < 4; i++) {
    char rel[64];
    snprintf(rel, sizeof rel, "files/%s", want[i].name);
    size_t len = 0;
    char *got = h_slurp(h_path(p, sizeof p, rel), &len);
    cr_assert_not_null(got, "%s is missing", rel);
    cr_assert_eq(len, want[i].len, "%s: %zu bytes, sent %zu", rel, len, want[i].len);
    cr_assert(memcmp(got, want[i].data, len) == 0, "%s differs from what the rank sent", rel);
    free(got);
  }
  /* w (256 bytes) is over the 200-byte limit: a shard of its own, listed before
   * the open shard holding v, as huggingface_hub does. */
  cr_assert(h_exists(h_path(p, sizeof p, "files/model-00001-of-00002.safetensors")));
  cr_assert(h_exists(h_path(p, sizeof p, "files/model-00002-of-00002.safetensors")));
  cr_assert(h_exists(h_path(p, sizeof p, "files/model.safetensors.index.json")));
  int n = h_dir_count(h_path(p, sizeof p, "files"));
  cr_assert_eq((uint64_t)n, s.sh->r[0].res.files, "wait says %llu files, the folder has %d",
               (unsigned long long)s.sh->r[0].res.files, n);
  /* bytes: every file in the folder added up */
  DIR *d = opendir(h_path(p, sizeof p, "files"));
  for (struct dirent *de; (de = readdir(d));) {
    if (de->d_name[0] == '.') continue;
    char rel[300], full[PATH_MAX];
    snprintf(rel, sizeof rel, "files/%s", de->d_name);
    struct stat st;
    cr_assert_eq(stat(h_path(full, sizeof full, rel), &st), 0);
    total += (uint64_t)st.st_size;
  }
  closedir(d);
  cr_assert_eq(total, s.sh->r[1].res.bytes, "wait says %llu bytes, the files hold %llu",
               (unsigned long long)s.sh->r[1].res.bytes, (unsigned long long)total);
  h_shared_free(s.sh);
}
