/* Shard files through a real daemon: max_shard_size, an oversized tensor, HF file names, the index, explicit order. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

TestSuite(shards, .init = h_setup, .fini = h_teardown, .timeout = 100);

/* The index file, parsed; asserts it exists and is JSON. */
static json_t *load_index(const char *rel) {
  char p[PATH_MAX];
  char *txt = h_slurp(h_path(p, sizeof p, rel), NULL);
  cr_assert_not_null(txt, "%s is missing", p);
  json_error_t je;
  json_t *j = json_loads(txt, JSON_REJECT_DUPLICATES, &je);
  cr_assert_not_null(j, "%s is not JSON: %s", p, je.text);
  free(txt);
  return j;
}

/* ------------------------------------------------------------------------ *
 * Many shards plus one tensor larger than the limit
 *
 * layer.N.w for N = 1..11, F32 [100] (400 bytes) except layer.6.w, F32
 * [625] (2500 bytes), max_shard_size 1000. Natural order puts layer.10 and
 * layer.11 after layer.9. huggingface_hub's split: {1,2} {3,4} then layer.6
 * alone as the third shard (appended while {5} is still open), {5,7} {8,9}
 * {10,11}: six files.
 * ------------------------------------------------------------------------ */
Test(shards, max_shard_size_many_files_and_an_oversized_tensor) {
  static char names[11][32];
  static h_put puts[22];
  size_t n = 0;
  for (int i = 1; i <= 11; i++) {
    snprintf(names[i - 1], sizeof names[i - 1], "layer.%d.w", i);
    uint64_t len = i == 6 ? 625 : 100;
    uint64_t half = len / 2 - 1; /* uneven halves from two ranks */
    puts[n++] = (h_put){.rank = 0, .name = names[i - 1], .dtype = "F32", .ndim = 1, .shape = {len},
                        .boxed = 1, .start = {0}, .count = {half}};
    puts[n++] = (h_put){.rank = 1, .name = names[i - 1], .dtype = "F32", .ndim = 1, .shape = {len},
                        .boxed = 1, .start = {half}, .count = {len - half}, .how = H_COPY};
  }
  h_script s = {.opts = {.save = "many", .dir = "runs/many", .world_size = 2, .max_shard_size = 1000},
                .puts = puts, .nputs = n, .seed = 21};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);

  static const int shard_of[12] = {0, 1, 1, 2, 2, 4, 3, 4, 5, 5, 6, 6}; /* by N, 1-based files */
  char p[PATH_MAX];
  for (int k = 1; k <= 6; k++) {
    char rel[96];
    snprintf(rel, sizeof rel, "runs/many/model-%05d-of-00006.safetensors", k);
    cr_assert(h_exists(h_path(p, sizeof p, rel)), "%s is missing", rel);
  }
  cr_assert(!h_exists(h_path(p, sizeof p, "runs/many/model.safetensors")));
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "runs/many")), 7, "six shards and the index, nothing else");
  cr_assert_eq(s.sh->r[0].res.files, 7);
  cr_assert_eq(s.sh->r[0].res.tensors, 11);

  json_t *ix = load_index("runs/many/model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  cr_assert_eq(json_object_size(wm), 11);
  for (int i = 1; i <= 11; i++) {
    char want[64];
    snprintf(want, sizeof want, "model-%05d-of-00006.safetensors", shard_of[i]);
    const char *got = json_string_value(json_object_get(wm, names[i - 1]));
    cr_assert_not_null(got, "weight_map lacks %s", names[i - 1]);
    cr_assert_str_eq(got, want, "%s", names[i - 1]);
  }
  json_t *meta = json_object_get(ix, "metadata");
  cr_assert_eq(json_integer_value(json_object_get(meta, "total_size")), 10 * 400 + 2500);
  cr_assert_eq(json_integer_value(json_object_get(meta, "total_parameters")), 10 * 100 + 625);
  json_decref(ix);

  /* No file holds more than the limit, except the one holding only layer.6.w. */
  sd_ckpt c;
  h_ckpt_read("runs/many", &c);
  cr_assert_eq(c.nfiles, 6);
  for (size_t f = 0; f < c.nfiles; f++) {
    if (c.files[f].h.ntensors == 1 && !strcmp(c.files[f].h.tensors[0].name, "layer.6.w")) {
      cr_assert_str_eq(c.files[f].name, "model-00003-of-00006.safetensors");
      continue;
    }
    cr_assert_leq(c.files[f].h.data_size, 1000, "%s holds %llu bytes", c.files[f].name,
                  (unsigned long long)c.files[f].h.data_size);
  }
  sd_ckpt_free(&c);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Explicit state-dict positions order the files, not names
 * ------------------------------------------------------------------------ */
Test(shards, explicit_index_orders_the_files) {
  /* One tensor per file (each 64 bytes, limit 64): files follow index. */
  static const h_put puts[] = {
      {.rank = 0, .name = "zeta", .dtype = "F64", .ndim = 1, .shape = {8}, .has_index = 1, .index = 0},
      {.rank = 1, .name = "alpha", .dtype = "F64", .ndim = 1, .shape = {8}, .has_index = 1, .index = 2},
      {.rank = 1, .name = "mid", .dtype = "F64", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
      /* the same position repeated by a replica is fine */
      {.rank = 0, .name = "mid", .dtype = "F64", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
  };
  h_script s = {.opts = {.save = "order", .dir = "order", .world_size = 2, .max_shard_size = 64,
                         .prefix = "pytorch_model"},
                .puts = puts, .nputs = 4, .seed = 22};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  json_t *ix = load_index("order/pytorch_model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "zeta")), "pytorch_model-00001-of-00003.safetensors");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "mid")), "pytorch_model-00002-of-00003.safetensors");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "alpha")), "pytorch_model-00003-of-00003.safetensors");
  json_decref(ix);
  h_shared_free(s.sh);
}

/* An MoE checkpoint as transformers writes it: each expert's gate and up are views of one fused
 * tensor, down of another; huggingface_hub keeps each storage in one shard and counts it once,
 * whole. The ranks say so by giving its tensors one index, and give the index's total_parameters
 * (transformers counts parameters, not the buffer "bias"). Limit 100 bytes: norm (16) | gate+up
 * of both experts (4 x 32 = 128, over the limit: a shard of its own, appended at once) | down
 * (2 x 32) joins norm's shard | bias (32) closes it. */
Test(shards, tensors_sharing_an_index_stay_in_one_shard) {
  static const h_put puts[] = {
      {.rank = 0, .name = "norm", .dtype = "F32", .ndim = 1, .shape = {4}, .has_index = 1, .index = 0},
      {.rank = 0, .name = "e.0.gate", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
      {.rank = 0, .name = "e.0.up", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
      {.rank = 1, .name = "e.1.gate", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
      {.rank = 1, .name = "e.1.up", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 1},
      {.rank = 0, .name = "e.0.down", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 5},
      {.rank = 1, .name = "e.1.down", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 5},
      {.rank = 1, .name = "bias", .dtype = "F32", .ndim = 1, .shape = {8}, .has_index = 1, .index = 7},
  };
  h_script s = {.opts = {.save = "moe", .dir = "moe", .world_size = 2, .max_shard_size = 100,
                         .total_parameters = 4 + 6 * 8},
                .puts = puts, .nputs = 8, .seed = 24};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  json_t *ix = load_index("moe/model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  static const char *const want[][2] = {
      {"e.0.gate", "model-00001-of-00003.safetensors"}, {"e.1.up", "model-00001-of-00003.safetensors"},
      {"norm", "model-00002-of-00003.safetensors"},     {"e.0.down", "model-00002-of-00003.safetensors"},
      {"e.1.down", "model-00002-of-00003.safetensors"}, {"bias", "model-00003-of-00003.safetensors"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    cr_assert_str_eq(json_string_value(json_object_get(wm, want[i][0])), want[i][1], "%s", want[i][0]);
  json_t *meta = json_object_get(ix, "metadata");
  cr_assert_eq(json_integer_value(json_object_get(meta, "total_parameters")), 52);
  cr_assert_eq(json_integer_value(json_object_get(meta, "total_size")), 60 * 4);
  json_decref(ix);
  h_shared_free(s.sh);

  /* More parameters than the tensors hold is no checkpoint: the save fails at seal, naming it. */
  h_script over = {.opts = {.save = "moe-over", .dir = "moe-over", .world_size = 2, .max_shard_size = 100,
                            .total_parameters = 61},
                   .puts = puts, .nputs = 8, .seed = 25};
  h_run(&over);
  h_expect_failed(&over, SHARDD_E_INVALID_ARGUMENT, "total_parameters 61 is more than the 60 elements",
                  (char *)NULL);
  h_expect_unpublished("moe-over");
  h_shared_free(over.sh);
}

Test(shards, natural_name_order_without_positions) {
  /* layers.2 before layers.10 (plain strcmp would say otherwise). */
  static const h_put puts[] = {
      {.rank = 0, .name = "layers.10.w", .dtype = "I32", .ndim = 1, .shape = {4}},
      {.rank = 0, .name = "layers.2.w", .dtype = "I32", .ndim = 1, .shape = {4}},
      {.rank = 0, .name = "layers.1.w", .dtype = "I32", .ndim = 1, .shape = {4}},
  };
  h_script s = {.opts = {.save = "natural", .dir = "natural", .world_size = 1, .max_shard_size = 16},
                .puts = puts, .nputs = 3, .seed = 23};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  json_t *ix = load_index("natural/model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "layers.1.w")), "model-00001-of-00003.safetensors");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "layers.2.w")), "model-00002-of-00003.safetensors");
  cr_assert_str_eq(json_string_value(json_object_get(wm, "layers.10.w")), "model-00003-of-00003.safetensors");
  json_decref(ix);
  h_shared_free(s.sh);
}

Test(shards, default_limit_gives_one_file_and_no_index) {
  static const h_put puts[] = {
      {.rank = 0, .name = "a", .dtype = "BF16", .ndim = 2, .shape = {64, 32}, .boxed = 1, .start = {0, 0},
       .count = {64, 16}},
      {.rank = 1, .name = "a", .dtype = "BF16", .ndim = 2, .shape = {64, 32}, .boxed = 1, .start = {0, 16},
       .count = {64, 16}},
      {.rank = 1, .name = "b", .dtype = "F32", .ndim = 1, .shape = {1000}},
  };
  h_script s = {.opts = {.save = "one", .dir = "one", .world_size = 2}, .puts = puts, .nputs = 3, .seed = 24};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  char p[PATH_MAX];
  cr_assert(h_exists(h_path(p, sizeof p, "one/model.safetensors")));
  cr_assert(!h_exists(h_path(p, sizeof p, "one/model.safetensors.index.json")));
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "one")), 1);
  cr_assert_eq(s.sh->r[1].res.files, 1);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Hundreds of small tensors over a small limit: many files, the index right
 * ------------------------------------------------------------------------ */
#define NBLK 300

Test(shards, hundreds_of_tensors_into_many_files) {
  static char names[NBLK][32];
  static h_put puts[NBLK * 2];
  static uint64_t sizes[NBLK];
  static uint32_t file_of[NBLK];
  size_t n = 0;
  for (int i = 0; i < NBLK; i++) {
    snprintf(names[i], sizeof names[i], "blk.%d.w", i);
    uint64_t rows = (uint64_t)(i % 7) + 1, cols = i % 11 == 0 ? 300 : 8; /* some over the limit */
    sizes[i] = rows * cols * 4;
    if (i % 3 == 0) { /* split between the ranks */
      puts[n++] = (h_put){.rank = 0, .name = names[i], .dtype = "F32", .ndim = 2, .shape = {rows, cols},
                          .boxed = 1, .start = {0, 0}, .count = {rows, cols / 2}};
      puts[n++] = (h_put){.rank = 1, .name = names[i], .dtype = "F32", .ndim = 2, .shape = {rows, cols},
                          .boxed = 1, .start = {0, cols / 2}, .count = {rows, cols - cols / 2}};
    } else {
      puts[n++] = (h_put){.rank = i % 2, .name = names[i], .dtype = "F32", .ndim = 2, .shape = {rows, cols},
                          .how = i % 5 == 0 ? H_INLINE : H_ARENA};
    }
  }
  h_script s = {.opts = {.save = "blocks", .dir = "blocks", .world_size = 2, .max_shard_size = 1024},
                .puts = puts, .nputs = n, .seed = 25};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  /* natural order is numeric order here, so the walk is blk.0 .. blk.299 */
  size_t nshards = h_hf_split(sizes, NBLK, 1024, file_of);
  cr_assert_gt(nshards, 50);
  char p[PATH_MAX];
  cr_assert_eq((size_t)h_dir_count(h_path(p, sizeof p, "blocks")), nshards + 1, "shards plus the index");
  json_t *ix = load_index("blocks/model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  cr_assert_eq(json_object_size(wm), NBLK);
  for (int i = 0; i < NBLK; i++) {
    char want[64];
    snprintf(want, sizeof want, "model-%05u-of-%05zu.safetensors", file_of[i] + 1, nshards);
    cr_assert_str_eq(json_string_value(json_object_get(wm, names[i])), want, "%s", names[i]);
  }
  json_decref(ix);
  h_shared_free(s.sh);
}

Test(shards, positions_first_then_natural_order) {
  /* one tensor per file: files follow a(0), c(1), then b2, b10 by name */
  static const h_put puts[] = {
      {.rank = 0, .name = "b10", .dtype = "I64", .ndim = 1, .shape = {2}},
      {.rank = 1, .name = "c", .dtype = "I64", .ndim = 1, .shape = {2}, .has_index = 1, .index = 7},
      {.rank = 0, .name = "b2", .dtype = "I64", .ndim = 1, .shape = {2}},
      {.rank = 1, .name = "a", .dtype = "I64", .ndim = 1, .shape = {2}, .has_index = 1, .index = 3},
  };
  h_script s = {.opts = {.save = "mixed", .dir = "mixed", .world_size = 2, .max_shard_size = 16},
                .puts = puts, .nputs = 4, .seed = 26};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  json_t *ix = load_index("mixed/model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  static const char *const order[] = {"a", "c", "b2", "b10"};
  for (int k = 0; k < 4; k++) {
    char want[64];
    snprintf(want, sizeof want, "model-%05d-of-00004.safetensors", k + 1);
    cr_assert_str_eq(json_string_value(json_object_get(wm, order[k])), want, "%s", order[k]);
  }
  json_decref(ix);
  h_shared_free(s.sh);
}
