/* Shard planning: huggingface_hub's split rule case by case and against a transliterated reference, names, order. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"

/* ------------------------------------------------------------------------ *
 * Helpers
 * ------------------------------------------------------------------------ */
static sd_tensor u8(const char *name, uint64_t bytes) {
  sd_tensor t = {.name = name, .dtype = SD_DT_U8, .ndim = 1, .index = -1};
  t.shape[0] = bytes;
  return t;
}

/* files[f] must hold exactly the tensors named in want[f] (any order). */
static void expect_files(const sd_plan *p, const sd_tensor *t, const char *const *want, size_t nwant) {
  cr_assert_eq(p->nfiles, nwant, "files: %zu, want %zu", p->nfiles, nwant);
  for (size_t f = 0; f < nwant; f++) {
    char got[512] = "";
    for (size_t i = 0; i < p->files[f].ntensors; i++) {
      strcat(got, t[p->files[f].tensors[i]].name);
      strcat(got, " ");
    }
    /* want lists are given in header order (descending size then name). */
    cr_assert_str_eq(got, want[f], "file %zu", f);
  }
}

static sd_plan plan_ok(const sd_tensor *t, size_t n, uint64_t max, const char *prefix) {
  sd_plan p;
  sd_error err = {0};
  sd_plan_opts o = {.max_shard_size = max, .prefix = prefix};
  int rc = sd_plan_build(&p, t, n, &o, &err);
  cr_assert_eq(rc, 0, "plan failed: %s", err.msg);
  return p;
}

/* ------------------------------------------------------------------------ *
 * The split rule, case by case
 * ------------------------------------------------------------------------ */
Test(plan, docstring_example_6_6_2_6_2_2_under_10) {
  /* "[6GB, 6GB, 2GB, 6GB, 2GB, 2GB] ... sharded as [6GB], [6+2GB], [6+2+2GB]" */
  const uint64_t G = 1000000000ULL;
  sd_tensor t[] = {u8("t1", 6 * G), u8("t2", 6 * G), u8("t3", 2 * G),
                   u8("t4", 6 * G), u8("t5", 2 * G), u8("t6", 2 * G)};
  sd_plan p = plan_ok(t, 6, 10 * G, NULL);
  const char *want[] = {"t1 ", "t2 t3 ", "t4 t5 t6 "};
  expect_files(&p, t, want, 3);
  cr_assert_str_eq(p.files[0].name, "model-00001-of-00003.safetensors");
  cr_assert_str_eq(p.files[2].name, "model-00003-of-00003.safetensors");
  cr_assert_eq(p.needs_index, 1);
  cr_assert_str_eq(p.index_name, "model.safetensors.index.json");
  cr_assert_eq(p.total_size, 24 * G);
  cr_assert_eq(p.total_parameters, 24 * G);
  sd_plan_free(&p);
}

Test(plan, oversize_tensor_is_appended_at_once_while_the_open_shard_continues) {
  /* huggingface_hub's test state dict: sizes 6, 10, 30, 2, 2 with a limit of 10. */
  sd_tensor t[] = {u8("layer_1", 6), u8("layer_2", 10), u8("layer_3", 30), u8("layer_4", 2),
                   u8("layer_5", 2)};
  sd_plan p = plan_ok(t, 5, 10, NULL);
  const char *want[] = {"layer_1 ", "layer_3 ", "layer_2 ", "layer_4 layer_5 "};
  expect_files(&p, t, want, 4);
  sd_plan_free(&p);

  sd_tensor m[] = {u8("a", 3), u8("b", 20), u8("c", 4)};
  p = plan_ok(m, 3, 10, NULL);
  const char *want2[] = {"b ", "a c "};
  expect_files(&p, m, want2, 2);
  cr_assert_eq(p.files[0].data_size, 20, "an oversize file holds a single tensor");
  sd_plan_free(&p);
}

Test(plan, tensor_exactly_at_the_limit) {
  sd_tensor t[] = {u8("a", 10), u8("b", 1)};
  sd_plan p = plan_ok(t, 2, 10, NULL);
  const char *w1[] = {"a ", "b "};
  expect_files(&p, t, w1, 2);
  sd_plan_free(&p);

  sd_tensor t2[] = {u8("a", 5), u8("b", 5), u8("c", 1)};
  p = plan_ok(t2, 3, 10, NULL);
  const char *w2[] = {"a b ", "c "};
  expect_files(&p, t2, w2, 2);
  sd_plan_free(&p);

  /* A zero-byte tensor still fits into a full shard. */
  sd_tensor t3[] = {u8("a", 10), u8("b", 0), u8("c", 1)};
  p = plan_ok(t3, 3, 10, NULL);
  const char *w3[] = {"a b ", "c "};
  expect_files(&p, t3, w3, 2);
  sd_plan_free(&p);

  sd_tensor t4[] = {u8("a", 10)};
  p = plan_ok(t4, 1, 10, NULL);
  cr_assert_eq(p.nfiles, 1);
  cr_assert_str_eq(p.files[0].name, "model.safetensors");
  cr_assert_eq(p.needs_index, 0);
  sd_plan_free(&p);
}

Test(plan, oversize_first_and_last) {
  sd_tensor t[] = {u8("a", 20), u8("b", 1), u8("c", 1), u8("d", 30)};
  sd_plan p = plan_ok(t, 4, 10, NULL);
  const char *want[] = {"a ", "d ", "b c "};
  expect_files(&p, t, want, 3);
  sd_plan_free(&p);
}

Test(plan, default_limit_is_5_gb) {
  sd_tensor t[] = {u8("a", 3000000000ULL), u8("b", 2000000000ULL), u8("c", 1)};
  sd_plan p = plan_ok(t, 3, 0, NULL);
  const char *want[] = {"a b ", "c "};
  expect_files(&p, t, want, 2);
  sd_plan_free(&p);
}

/* ------------------------------------------------------------------------ *
 * Names and options
 * ------------------------------------------------------------------------ */
Test(plan, single_file_and_prefix) {
  sd_tensor t[] = {u8("x", 4), u8("y", 4)};
  sd_plan p = plan_ok(t, 2, 0, "pytorch_model");
  cr_assert_eq(p.nfiles, 1);
  cr_assert_str_eq(p.files[0].name, "pytorch_model.safetensors");
  cr_assert_str_eq(p.index_name, "pytorch_model.safetensors.index.json");
  cr_assert_eq(p.needs_index, 0);
  sd_plan_free(&p);

  p = plan_ok(t, 2, 4, "ckpt");
  cr_assert_eq(p.nfiles, 2);
  cr_assert_str_eq(p.files[0].name, "ckpt-00001-of-00002.safetensors");
  cr_assert_str_eq(p.files[1].name, "ckpt-00002-of-00002.safetensors");
  sd_plan_free(&p);
}

/* ------------------------------------------------------------------------ *
 * File series: tensors of another prefix (an optimizer's) split apart
 * ------------------------------------------------------------------------ */
static sd_tensor u8_in(const char *prefix, const char *name, uint64_t bytes) {
  sd_tensor t = u8(name, bytes);
  t.prefix = prefix;
  return t;
}

Test(plan, another_prefix_is_a_file_series_of_its_own_under_one_index) {
  /* State-dict order interleaves them; each series is split alone and numbered alone; m2's
   * explicit "model" is the plan's own prefix. */
  sd_tensor t[] = {u8("m1", 6), u8_in("optimizer", "o1", 4), u8_in("model", "m2", 6), u8_in("optimizer", "o2", 4),
                   u8_in("optimizer", "o3", 4)};
  for (size_t i = 0; i < 5; i++) t[i].index = (int64_t)i;
  sd_plan p = plan_ok(t, 5, 10, NULL);
  const char *want[] = {"m1 ", "m2 ", "o1 o2 ", "o3 "};
  expect_files(&p, t, want, 4);
  const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                         "optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors"};
  for (size_t f = 0; f < 4; f++) cr_assert_str_eq(p.files[f].name, names[f]);
  cr_assert_eq(p.needs_index, 1);
  cr_assert_str_eq(p.index_name, "model.safetensors.index.json");
  cr_assert_eq(p.total_size, 24);
  /* The one index maps every tensor of both series to its file. */
  size_t len = 0;
  sd_error err = {0};
  char *json = sd_index_encode(&p, t, &len, &err);
  cr_assert(json, "%s", err.msg);
  json_t *ix = json_loadb(json, len, 0, NULL);
  json_t *wm = json_object_get(ix, "weight_map");
  cr_assert_eq(json_object_size(wm), 5);
  cr_assert_str_eq(json_string_value(json_object_get(wm, "m2")), names[1]);
  cr_assert_str_eq(json_string_value(json_object_get(wm, "o3")), names[3]);
  json_decref(ix);
  free(json);
  sd_plan_free(&p);

  /* Under the plan's prefix "pytorch_model", m2's "model" is a third series, after optimizer's
   * (whose first tensor is walked first); one file each, with the single-file names. */
  p = plan_ok(t, 5, 0, "pytorch_model");
  const char *want3[] = {"m1 ", "o1 o2 o3 ", "m2 "};
  expect_files(&p, t, want3, 3);
  cr_assert_str_eq(p.files[0].name, "pytorch_model.safetensors");
  cr_assert_str_eq(p.files[1].name, "optimizer.safetensors");
  cr_assert_str_eq(p.files[2].name, "model.safetensors");
  cr_assert_str_eq(p.index_name, "pytorch_model.safetensors.index.json");
  sd_plan_free(&p);
  sd_tensor u[] = {u8("m1", 6), u8_in("optimizer", "o1", 4), u8("m2", 6)};
  p = plan_ok(u, 3, 0, NULL);
  const char *want2[] = {"m1 m2 ", "o1 "}; /* header order: the larger first, then by name */
  expect_files(&p, u, want2, 2);
  cr_assert_str_eq(p.files[0].name, "model.safetensors");
  cr_assert_str_eq(p.files[1].name, "optimizer.safetensors");
  cr_assert_eq(p.needs_index, 1);
  sd_plan_free(&p);
}

Test(plan, a_series_alone_has_no_empty_file_of_the_plans_prefix) {
  sd_tensor t[] = {u8_in("optimizer", "o1", 4), u8_in("optimizer", "o2", 4)};
  sd_plan p = plan_ok(t, 2, 0, NULL);
  cr_assert_eq(p.nfiles, 1);
  cr_assert_str_eq(p.files[0].name, "optimizer.safetensors");
  cr_assert_eq(p.needs_index, 0);
  sd_plan_free(&p);
}

Test(plan, series_prefixes_are_checked_named_bounded_and_never_share_a_file_name) {
  sd_plan p;
  sd_error err = {0};
  sd_tensor bad[] = {u8("m", 4), u8_in("a/b", "o", 4)};
  cr_assert_eq(sd_plan_build(&p, bad, 2, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "prefix 'a/b'"), "%s", err.msg);
  /* "a" in two files makes a-00001-of-00002.safetensors, the one-file name of the other prefix. */
  sd_tensor clash[] = {u8_in("a", "x", 4), u8_in("a", "y", 4), u8_in("a-00001-of-00002", "z", 4)};
  cr_assert_eq(sd_plan_build(&p, clash, 3, &(sd_plan_opts){.max_shard_size = 4}, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "both make a-00001-of-00002.safetensors"), "%s", err.msg);
  cr_assert_eq(p.nfiles, 0);
  char pre[SD_MAX_SERIES + 1][8], nm[SD_MAX_SERIES + 1][8];
  sd_tensor many[SD_MAX_SERIES + 1];
  for (int i = 0; i <= SD_MAX_SERIES; i++) {
    snprintf(pre[i], sizeof pre[i], "p%d", i);
    snprintf(nm[i], sizeof nm[i], "t%d", i);
    many[i] = u8_in(pre[i], nm[i], 4);
  }
  /* The plan's own prefix and 15 others fit; a 16th other does not. */
  cr_assert_eq(sd_plan_build(&p, many, SD_MAX_SERIES - 1, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, SD_MAX_SERIES - 1);
  sd_plan_free(&p);
  cr_assert_eq(sd_plan_build(&p, many, SD_MAX_SERIES, NULL, &err), SHARDD_E_LIMIT);
  cr_assert(strstr(err.msg, "at most 16 prefixes"), "%s", err.msg);
}

Test(plan, bad_prefixes_are_refused) {
  const char *bad[] = {"", ".hidden", "a/b", "/abs", "x\ny", "bad\xff"};
  sd_tensor t[] = {u8("x", 4)};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sd_plan p;
    sd_error err = {0};
    sd_plan_opts o = {.prefix = bad[i]};
    cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), SHARDD_E_INVALID_ARGUMENT, "%zu", i);
    cr_assert(strstr(err.msg, "prefix"), "%s", err.msg);
    cr_assert_eq(p.nfiles, 0);
    sd_plan_free(&p);
  }
  char longp[260];
  memset(longp, 'p', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  sd_plan p;
  sd_plan_opts o = {.prefix = longp};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, NULL), SHARDD_E_INVALID_ARGUMENT);
}

Test(plan, no_tensors_gives_one_empty_file) {
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, NULL, 0, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, 1);
  cr_assert_eq(p.needs_index, 0);
  cr_assert_str_eq(p.files[0].name, "model.safetensors");
  cr_assert_eq(p.files[0].ntensors, 0);
  cr_assert_eq(p.files[0].data_size, 0);
  cr_assert_eq(p.files[0].header_size, 4096);
  cr_assert_eq(p.files[0].file_size, 4096);
  const char *json = "{\"__metadata__\":{\"format\":\"pt\"}}";
  cr_assert_eq(memcmp(p.files[0].header + 8, json, strlen(json)), 0);
  cr_assert_eq(p.total_size, 0);
  sd_plan_free(&p);
}

Test(plan, natural_name_order_decides_the_walk) {
  sd_tensor t[] = {u8("layers.10.w", 8), u8("layers.2.w", 8), u8("layers.1.w", 8), u8("embed", 8)};
  sd_plan p = plan_ok(t, 4, 8, NULL);
  const char *want[] = {"embed ", "layers.1.w ", "layers.2.w ", "layers.10.w "};
  expect_files(&p, t, want, 4);
  sd_plan_free(&p);
}

Test(plan, natural_order_with_leading_zeros_is_total) {
  sd_tensor t[] = {u8("w01", 8), u8("w1", 8), u8("w001", 8), u8("w10", 8), u8("w2", 8), u8("w", 8),
                   u8("w1.0", 8), u8("w01.0", 8)};
  sd_plan p = plan_ok(t, 8, 8, NULL);
  /* Token sequences decide first; leading zeros only break exact ties. */
  const char *want[] = {"w ", "w1 ", "w01 ", "w001 ", "w1.0 ", "w01.0 ", "w2 ", "w10 "};
  expect_files(&p, t, want, 8);
  sd_plan_free(&p);
}

Test(plan, positions_may_be_large) {
  sd_tensor t[] = {u8("b", 8), u8("a", 8), u8("c", 8), u8("d", 8), u8("e", 8)};
  t[0].index = 5;
  t[1].index = 4;
  t[2].index = (int64_t)1 << 40;    /* beyond 32 bits */
  t[3].index = 256;                 /* differs from 5 only in a higher byte */
  sd_plan p = plan_ok(t, 5, 8, NULL);
  const char *want[] = {"a ", "b ", "d ", "c ", "e "};
  expect_files(&p, t, want, 5);
  sd_plan_free(&p);
}

/* transformers' save_pretrained of an MoE model: experts.{e}.gate_proj and up_proj are views of
 * one fused gate_up_proj, down_proj of another. huggingface_hub counts a shared storage once,
 * whole, at its first name, and puts every name on it into that name's shard; shardd is told
 * which tensors share one by a shared index. */
Test(plan, tensors_sharing_an_index_are_one_entry) {
  sd_tensor t[] = {u8("norm", 4),          u8("e.0.gate", 6), u8("e.0.up", 6), u8("e.1.gate", 6),
                   u8("e.1.up", 6),        u8("e.0.down", 5), u8("e.1.down", 5), u8("head", 9),
                   u8("tail", 2)};
  int64_t at[] = {0, 1, 1, 1, 1, 5, 5, 7, 8};
  for (size_t i = 0; i < 9; i++) t[i].index = at[i];
  /* The 24 bytes of gate/up are over 20: a shard of their own, appended at once while the one
   * holding norm stays open for down's 10; head then closes it. */
  sd_plan p = plan_ok(t, 9, 20, NULL);
  const char *want[] = {"e.0.gate e.0.up e.1.gate e.1.up ", "e.0.down e.1.down norm ", "head tail "};
  expect_files(&p, t, want, 3);
  cr_assert_eq(p.total_size, 4 + 24 + 10 + 9 + 2);
  sd_plan_free(&p);
  /* Room for 24: the open shard closes before the group, which then fills the next. */
  p = plan_ok(t, 9, 25, NULL);
  const char *want2[] = {"norm ", "e.0.gate e.0.up e.1.gate e.1.up ", "e.0.down e.1.down head tail "};
  expect_files(&p, t, want2, 3);
  sd_plan_free(&p);
  /* Counted one by one (no shared index), the same tensors split inside the fused parameter. */
  for (size_t i = 0; i < 9; i++) t[i].index = (int64_t)i;
  p = plan_ok(t, 9, 20, NULL);
  const char *want3[] = {"e.0.gate e.0.up norm ", "e.0.down e.1.gate e.1.up ", "e.1.down head tail "};
  expect_files(&p, t, want3, 3);
  sd_plan_free(&p);
}

static void check_index(const sd_plan *p, const sd_tensor *t);

/* transformers' index counts parameters, not the buffers saved beside them: given, it is kept;
 * more than the elements saved is no checkpoint. */
Test(plan, total_parameters_as_given) {
  sd_tensor t[] = {u8("w", 6), u8("buffer", 2)};
  /* 0: a model of buffers only; 9: more than the 8 elements saved */
  static const struct {
    uint64_t given;
    int rc;
  } cases[] = {{6, 0}, {0, 0}, {8, 0}, {9, SHARDD_E_INVALID_ARGUMENT}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sd_plan p;
    sd_error err = {0};
    sd_plan_opts o = {.max_shard_size = 4, .total_parameters = cases[i].given, .has_total_parameters = 1};
    cr_assert_eq(sd_plan_build(&p, t, 2, &o, &err), cases[i].rc, "%" PRIu64 ": %s", cases[i].given, err.msg);
    if (cases[i].rc) {
      cr_assert_str_eq(err.msg, "total_parameters 9 is more than the 8 elements of the tensors saved");
      cr_assert_eq(p.nfiles, 0);
      continue;
    }
    cr_assert_eq(p.total_parameters, cases[i].given);
    cr_assert_eq(p.total_size, 8);
    check_index(&p, t);
    sd_plan_free(&p);
  }
}

Test(plan, explicit_positions_come_first_in_position_order) {
  sd_tensor t[] = {u8("a", 8), u8("b", 8), u8("c", 8), u8("d", 8), u8("e", 8)};
  t[0].index = 7;
  t[2].index = 0;
  t[4].index = 3;
  sd_plan p = plan_ok(t, 5, 8, NULL);
  const char *want[] = {"c ", "e ", "a ", "b ", "d "};
  expect_files(&p, t, want, 5);
  sd_plan_free(&p);
  /* Tensors sharing a position sort there as one entry; those with none still come last, alone. */
  t[1].index = 3;
  p = plan_ok(t, 5, 16, NULL);
  const char *grouped[] = {"c ", "b e ", "a d "};
  expect_files(&p, t, grouped, 3);
  sd_plan_free(&p);
}

Test(plan, duplicate_names_are_refused) {
  sd_tensor t[] = {u8("a", 1), u8("layers.1.w", 2), u8("b", 1), u8("layers.1.w", 2)};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 4, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "tensor 'layers.1.w' is given twice");
  cr_assert_eq(p.nfiles, 0);
  cr_assert_null(p.loc);
}

Test(plan, invalid_tensors_are_named) {
  sd_plan p;
  sd_error err = {0};
  sd_tensor t[] = {u8("ok", 1), u8("bad\x01", 1)};
  cr_assert_eq(sd_plan_build(&p, t, 2, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "'bad'"), "%s", err.msg);

  sd_tensor big[] = {u8("huge", 1)};
  big[0].dtype = SD_DT_F64;
  big[0].ndim = 2;
  big[0].shape[0] = 1ULL << 31;
  big[0].shape[1] = 1ULL << 31;
  cr_assert_eq(sd_plan_build(&p, big, 1, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "tensor 'huge'"), "%s", err.msg);

  /* Each fits, the sum does not. */
  sd_tensor two[] = {u8("x", 1ULL << 62), u8("y", 1ULL << 62)};
  cr_assert_eq(sd_plan_build(&p, two, 2, NULL, &err), SHARDD_E_LIMIT);
  cr_assert(strstr(err.msg, "total size"), "%s", err.msg);

  sd_tensor nul[] = {u8("x", 1)};
  nul[0].name = NULL;
  cr_assert_eq(sd_plan_build(&p, nul, 1, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
}

Test(plan, totals_and_locations) {
  sd_tensor t[] = {u8("a", 5), u8("b", 0), u8("c", 3)};
  t[2].dtype = SD_DT_F32;
  t[2].ndim = 2;
  t[2].shape[0] = 2;
  t[2].shape[1] = 3;
  sd_plan p = plan_ok(t, 3, 0, NULL);
  cr_assert_eq(p.total_size, 5 + 24);
  cr_assert_eq(p.total_parameters, 5 + 6);
  cr_assert_eq(p.ntensors, 3);
  /* Header order: c (F32) first, then a, b by name. */
  cr_assert_eq(p.loc[2].data_begin, 0);
  cr_assert_eq(p.loc[0].data_begin, 24);
  cr_assert_eq(p.loc[1].data_begin, 29);
  cr_assert_eq(p.loc[1].nbytes, 0);
  cr_assert_eq(p.loc[0].file_offset, 4096 + 24);
  cr_assert_eq(p.files[0].file_size, 4096 + 29);
  sd_plan_free(&p);
}

/* ------------------------------------------------------------------------ *
 * Randomized: the planner against a transliteration of huggingface_hub
 * ------------------------------------------------------------------------ */
static const sd_tensor *g_t;

static int walk_cmp(const void *pa, const void *pb) {
  const sd_tensor *a = &g_t[*(const uint32_t *)pa], *b = &g_t[*(const uint32_t *)pb];
  int ha = a->index >= 0, hb = b->index >= 0;
  if (ha != hb) return ha ? -1 : 1;
  if (ha && a->index != b->index) return a->index < b->index ? -1 : 1;
  return sd_natural_cmp(a->name, b->name);
}

/* for key, tensor in state_dict.items(): ... exactly as _base.py reads, with
 * get_storage_id: tensors of one index share a storage as large as all of
 * them, and join the shard of its first name once the walk is done. */
static size_t hf_reference(const sd_tensor *t, const uint32_t *order, const uint64_t *size, size_t n,
                           uint64_t max, uint32_t *shard_of) {
  size_t nshards = 0;
  uint32_t *cur = malloc((n + 1) * sizeof *cur), *first = malloc((n + 1) * sizeof *first);
  size_t ncur = 0;
  uint64_t cur_size = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t x = order[i];
    first[x] = x;
    for (size_t j = 0; j < i && t[x].index >= 0; j++)
      if (t[order[j]].index == t[x].index) {
        first[x] = order[j];
        break;
      }
    if (first[x] != x) continue; /* storage_id in storage_id_to_tensors */
    uint64_t storage = size[x];
    for (size_t k = 0; k < n && t[x].index >= 0; k++)
      if (k != x && t[k].index == t[x].index) storage += size[k];
    if (storage > max) {
      shard_of[x] = (uint32_t)nshards++;
      continue;
    }
    if (cur_size + storage > max) {
      for (size_t k = 0; k < ncur; k++) shard_of[cur[k]] = (uint32_t)nshards;
      nshards++;
      ncur = 0;
      cur_size = 0;
    }
    cur[ncur++] = x;
    cur_size += storage;
  }
  if (ncur > 0) {
    for (size_t k = 0; k < ncur; k++) shard_of[cur[k]] = (uint32_t)nshards;
    nshards++;
  }
  for (size_t i = 0; i < n; i++) shard_of[order[i]] = shard_of[first[order[i]]];
  free(cur);
  free(first);
  return nshards;
}

static void check_header(const sd_plan *p, size_t f, const sd_tensor *t, const sd_plan_opts *o) {
  const sd_plan_file *pf = &p->files[f];
  uint64_t len = 0;
  for (int i = 0; i < 8; i++) len |= (uint64_t)(unsigned char)pf->header[i] << (8 * i);
  cr_assert_eq(len + 8, pf->header_size);
  cr_assert_eq(pf->header_size % 4096, 0);
  cr_assert_eq(pf->header[8], '{');
  json_error_t jerr;
  json_t *root = json_loadb(pf->header + 8, len, JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(root, "%s: %s", pf->name, jerr.text);
  cr_assert_eq(json_object_size(root), pf->ntensors + 1);
  void *it = json_object_iter(root);
  cr_assert_str_eq(json_object_iter_key(it), "__metadata__");
  json_t *meta = json_object_iter_value(it);
  cr_assert_str_eq(json_string_value(json_object_get(meta, "format")), "pt");
  for (size_t k = 0; k < o->nmetadata; k++)
    if (strcmp(o->metadata[k].key, "format") != 0)
      cr_assert_str_eq(json_string_value(json_object_get(meta, o->metadata[k].key)),
                       o->metadata[k].value);
  uint64_t off = 0;
  for (size_t i = 0; i < pf->ntensors; i++) {
    it = json_object_iter_next(root, it);
    uint32_t ti = pf->tensors[i];
    const sd_tensor *tt = &t[ti];
    cr_assert_str_eq(json_object_iter_key(it), tt->name, "header order");
    json_t *e = json_object_iter_value(it);
    cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), sd_dtype_name(tt->dtype));
    json_t *sh = json_object_get(e, "shape");
    cr_assert_eq(json_array_size(sh), tt->ndim);
    for (uint32_t d = 0; d < tt->ndim; d++)
      cr_assert_eq((uint64_t)json_integer_value(json_array_get(sh, d)), tt->shape[d]);
    json_t *dof = json_object_get(e, "data_offsets");
    uint64_t b = (uint64_t)json_integer_value(json_array_get(dof, 0));
    uint64_t en = (uint64_t)json_integer_value(json_array_get(dof, 1));
    cr_assert_eq(b, off, "contiguous from 0");
    cr_assert_eq(en - b, p->loc[ti].nbytes);
    cr_assert_eq(p->loc[ti].data_begin, b);
    cr_assert_eq(p->loc[ti].file_offset, pf->header_size + b);
    cr_assert_eq(b % sd_dtype_size(tt->dtype), 0, "aligned to its element size");
    if (i > 0) {
      const sd_tensor *prev = &t[pf->tensors[i - 1]];
      unsigned sp = sd_dtype_size(prev->dtype), sc = sd_dtype_size(tt->dtype);
      cr_assert(sp > sc || (sp == sc && strcmp(prev->name, tt->name) < 0), "size then name");
    }
    off = en;
  }
  cr_assert_eq(off, pf->data_size);
  cr_assert_eq(pf->file_size, pf->header_size + pf->data_size);
  json_decref(root);
}

static void check_index(const sd_plan *p, const sd_tensor *t) {
  size_t len = 0;
  sd_error err = {0};
  char *ix = sd_index_encode(p, t, &len, &err);
  cr_assert_not_null(ix, "%s", err.msg);
  cr_assert_eq(strlen(ix), len);
  json_error_t jerr;
  json_t *root = json_loadb(ix, len, JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(root, "%s", jerr.text);
  json_t *md = json_object_get(root, "metadata");
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(md, "total_size")), p->total_size);
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(md, "total_parameters")),
               p->total_parameters);
  json_t *wm = json_object_get(root, "weight_map");
  cr_assert_eq(json_object_size(wm), p->ntensors);
  const char *prev = NULL;
  const char *key;
  json_t *val;
  json_object_foreach(wm, key, val) {
    if (prev) cr_assert_lt(strcmp(prev, key), 0, "sorted keys");
    prev = key;
  }
  for (size_t i = 0; i < p->ntensors; i++)
    cr_assert_str_eq(json_string_value(json_object_get(wm, t[i].name)),
                     p->files[p->loc[i].file].name);
  json_decref(root);
  free(ix);
}

Test(plan, randomized_against_the_reference, .timeout = 60) {
  srand(12345);
  static const sd_kv meta[] = {{"format", "np"}, {"step", "100"}, {"a\"b", "line\nbreak"}};
  for (int round = 0; round < 400; round++) {
    size_t n = (size_t)(rand() % 120);
    if (round % 50 == 0) n = 0;
    sd_tensor *t = calloc(n + 1, sizeof *t);
    char (*names)[48] = calloc(n + 1, sizeof *names);
    uint64_t *size = calloc(n + 1, sizeof *size);
    /* positions: none, some, every one (distinct, or some shared) */
    int use_index = rand() % 3 == 0, all_index = rand() % 4, distinct = rand() % 2;
    for (size_t i = 0; i < n; i++) {
      static const char *fmt[] = {"layers.%zu.w", "blk%zu", "l.%zu.\xc3\xa9", "x%03zu"};
      snprintf(names[i], sizeof names[i], fmt[rand() % 4], i * 7 % (n + 3));
      /* make unique */
      char suffix[24];
      snprintf(suffix, sizeof suffix, "#%zu", i);
      strcat(names[i], suffix);
      t[i].name = names[i];
      t[i].dtype = (sd_dtype)(rand() % SD_DT__COUNT);
      t[i].ndim = (uint32_t)(rand() % 4);
      for (uint32_t d = 0; d < t[i].ndim; d++)
        t[i].shape[d] = (uint64_t)(rand() % 6 == 0 ? 0 : rand() % 9 + 1);
      t[i].index = use_index && rand() % 2 ? rand() % 50 : -1;
      if (all_index == 0) t[i].index = distinct ? (int64_t)((i * 37 + 11) % (n + 5) + (i * 37 + 11) / (n + 5) * 1000)
                                                : rand() % 50;
      cr_assert_eq(sd_tensor_nbytes(&t[i], &size[i], NULL), 0);
    }
    uint64_t max;
    switch (rand() % 4) {
      case 0: max = 1 + (uint64_t)(rand() % 64); break;
      case 1: max = n ? size[rand() % n] + (uint64_t)(rand() % 2) : 1; break; /* at a tensor's size */
      case 2: max = 1 + (uint64_t)(rand() % 2000); break;
      default: max = 0; break;
    }
    /* names_unique (the names here differ) changes how the walk is found, never what it is */
    sd_plan_opts o = {.max_shard_size = max, .metadata = meta, .nmetadata = rand() % 4, .names_unique = rand() % 2};
    sd_plan p;
    sd_error err = {0};
    cr_assert_eq(sd_plan_build(&p, t, n, &o, &err), 0, "round %d: %s", round, err.msg);
    uint64_t lim = max ? max : SD_DEFAULT_MAX_SHARD_SIZE;

    uint32_t *order = malloc((n + 1) * sizeof *order);
    uint32_t *shard_of = malloc((n + 1) * sizeof *shard_of);
    for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    g_t = t;
    qsort(order, n, sizeof *order, walk_cmp);
    size_t ns = n ? hf_reference(t, order, size, n, lim, shard_of) : 1;
    cr_assert_eq(p.nfiles, ns, "round %d", round);
    cr_assert_eq(p.needs_index, ns > 1);

    uint8_t *seen = calloc(n + 1, 1);
    uint64_t total = 0;
    for (size_t f = 0; f < p.nfiles; f++) {
      const sd_plan_file *pf = &p.files[f];
      char want[64];
      if (ns == 1)
        snprintf(want, sizeof want, "model.safetensors");
      else
        snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", f + 1, ns);
      cr_assert_str_eq(pf->name, want);
      uint64_t data = 0;
      for (size_t i = 0; i < pf->ntensors; i++) {
        uint32_t ti = pf->tensors[i];
        cr_assert_lt(ti, n);
        cr_assert_eq(seen[ti], 0, "a tensor in two files");
        seen[ti] = 1;
        cr_assert_eq(p.loc[ti].file, f);
        cr_assert_eq(shard_of[ti], f, "round %d: tensor %s in file %zu, reference says %u", round,
                     t[ti].name, f, shard_of[ti]);
        data += size[ti];
      }
      int one_entry = 1; /* a single tensor, or tensors of one index */
      for (size_t i = 1; i < pf->ntensors; i++)
        one_entry &= t[pf->tensors[i]].index >= 0 && t[pf->tensors[i]].index == t[pf->tensors[0]].index;
      cr_assert(data <= lim || one_entry, "file over the limit with several entries");
      cr_assert(n == 0 || pf->ntensors > 0, "no empty files");
      total += data;
      check_header(&p, f, t, &o);
    }
    for (size_t i = 0; i < n; i++) cr_assert_eq(seen[i], 1, "every tensor placed");
    cr_assert_eq(p.total_size, total);
    check_index(&p, t);
    sd_plan_free(&p);
    free(seen);
    free(order);
    free(shard_of);
    free(t);
    free(names);
    free(size);
  }
}
