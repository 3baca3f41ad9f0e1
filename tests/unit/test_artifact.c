/* Artifact names a `file` may not take: the index, shard names (any digit count), temporary names; others pass. Files sent in parts, joined in rank order. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_artifact.h"

static void refused(const char *prefix, const char *name, const char *frag) {
  sd_error err = {0};
  cr_assert_eq(sd_artifact_name_check(prefix, name, &err), SHARDD_E_INVALID_ARGUMENT, "'%s' (prefix '%s') passed",
               name, prefix);
  cr_assert_eq(err.code, SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, name), "the message does not name '%s': %s", name, err.msg);
  cr_assert(strstr(err.msg, frag), "the message lacks '%s': %s", frag, err.msg);
}

static void allowed(const char *prefix, const char *name) {
  sd_error err = {0};
  cr_assert_eq(sd_artifact_name_check(prefix, name, &err), 0, "'%s' (prefix '%s') refused: %s", name, prefix,
               err.msg);
  cr_assert_eq(err.code, 0);
}

Test(artifact, the_index_name_is_refused_for_the_saves_prefix) {
  refused("model", "model.safetensors.index.json", "index");
  refused("ema", "ema.safetensors.index.json", "index");
  allowed("ema", "model.safetensors.index.json"); /* another prefix's index is just a file */
}

Test(artifact, shard_names_are_refused_whatever_the_shape) {
  refused("model", "model.safetensors", "shards");
  refused("model", "model-00001-of-00003.safetensors", "shards");
  refused("model", "model-00002-of-00002.safetensors", "shards");
  refused("model", "model-100000-of-100000.safetensors", "shards");
  refused("model", "model-1-of-2.safetensors", "shards");
  refused("m-x", "m-x-00001-of-00001.safetensors", "shards");
}

Test(artifact, temporary_names_are_refused) {
  refused("model", ".shardd-tmp-1234", "temporary");
  refused("model", ".shardd-tmp-", "temporary");
  refused("other", ".shardd-tmp-model.safetensors", "temporary");
}

Test(artifact, near_misses_are_ordinary_files) {
  allowed("model", "config.json");
  allowed("model", "model.safetensors.json");
  allowed("model", "model.safetensors.index.json.bak");
  allowed("model", "model-00001-of-.safetensors");
  allowed("model", "model-of-00001.safetensors");
  allowed("model", "model-0a001-of-00002.safetensors");
  allowed("model", "model-00001-of-00002.safetensors.bak");
  allowed("model", "modelx.safetensors");
  allowed("model", ".shardd-tm");
  allowed("model", "tokenizer.json");
  allowed("model", "mode.safetensors");
}

/* Parts of one name are joined in rank order whatever order they came in, a rank that sent none
 * adds nothing, whole files stay as sent, each name once in the order first sent. */
Test(artifact, parts_are_joined_in_rank_order_beside_whole_files) {
  const uint8_t a[] = "rank 3\n", b[] = "rank 0\n", c[] = "{}", d[] = "rank 1\n";
  sd_file_piece in[] = {
      {.name = "bytes.jsonl", .data = a, .len = 7, .rank = 3, .part = 1},
      {.name = "config.json", .data = c, .len = 2, .rank = 0},
      {.name = "bytes.jsonl", .data = b, .len = 7, .rank = 0, .part = 1},
      {.name = "bytes.jsonl", .data = d, .len = 7, .rank = 1, .part = 1},
      {.name = "empty.txt", .data = NULL, .len = 0, .rank = 2, .part = 1},
  };
  sd_plan plan;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&plan, NULL, 0, NULL, &err), 0, "%s", err.msg);
  sd_file_out out[5];
  size_t n = 0;
  cr_assert_eq(sd_files_join(in, 5, &plan, out, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(n, 3);
  cr_assert_str_eq(out[0].name, "bytes.jsonl");
  cr_assert_eq(out[0].len, 21);
  cr_assert_eq(memcmp(out[0].data, "rank 0\nrank 1\nrank 3\n", 21), 0);
  cr_assert(out[0].owned);
  cr_assert_str_eq(out[1].name, "config.json");
  cr_assert_eq(out[1].data, c, "a whole file is not copied");
  cr_assert_null(out[1].owned);
  cr_assert_str_eq(out[2].name, "empty.txt");
  cr_assert_eq(out[2].len, 0);
  for (size_t i = 0; i < n; i++) free(out[i].owned);
  /* A joined file named like one of the plan's files is refused, naming it; nothing is left. */
  in[0].name = in[2].name = in[3].name = "model.safetensors";
  cr_assert_eq(sd_files_join(in, 5, &plan, out, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "file 'model.safetensors' has the name of a checkpoint file"), "%s", err.msg);
  sd_plan_free(&plan);
}
