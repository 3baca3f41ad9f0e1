/* Artifact names a `file` may not take: the index, shard names (any digit count), temporary names; others pass. */
#include <criterion/criterion.h>
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
