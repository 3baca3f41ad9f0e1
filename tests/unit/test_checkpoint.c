/* Checkpoint folders: the index and the shards must agree exactly; each mismatch is refused with a precise message. */
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
#include "sd_reader.h"

#define F1 "model-00001-of-00002.safetensors"
#define F2 "model-00002-of-00002.safetensors"

/* ------------------------------------------------------------------------ *
 * Building folders by hand, independently of the writer
 * ------------------------------------------------------------------------ */

typedef struct {
  const char *name;
  const char *dtype;
  unsigned esz;
  uint64_t count; /* 1-d shape */
} spec;

static void mk_tmp(void) { dir_setup("ckpt", 1); }
static void rm_tmp(void) { dir_teardown(); }

static void shard(const char *file, const spec *s, size_t n) {
  char js[4096];
  size_t k = (size_t)snprintf(js, sizeof js, "{\"__metadata__\":{\"format\":\"pt\"}");
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t nb = s[i].esz * s[i].count;
    k += (size_t)snprintf(js + k, sizeof js - k,
                          ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRIu64
                          "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                          s[i].name, s[i].dtype, s[i].count, off, off + nb);
    off += nb;
  }
  k += (size_t)snprintf(js + k, sizeof js - k, "}");
  while (k % 8) js[k++] = ' ';
  size_t len = 8 + k + off;
  unsigned char *b = calloc(1, len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)k >> (8 * i));
  memcpy(b + 8, js, k);
  put(file, b, len);
  free(b);
}

static const spec S1[] = {{"a", "F32", 4, 4}, {"b", "U8", 1, 3}};
static const spec S2[] = {{"c", "F32", 4, 2}};

static void good_shards(void) {
  shard(F1, S1, 2);
  shard(F2, S2, 1);
}

#define INDEX "model.safetensors.index.json"
#define WM_OK "\"weight_map\":{\"a\":\"" F1 "\",\"b\":\"" F1 "\",\"c\":\"" F2 "\"}"

static void expect_code(int code, const char *frag) {
  sd_ckpt c;
  sd_error err;
  sd_error_clear(&err);
  int rc = sd_ckpt_read(ckdir, &c, &err);
  cr_assert_eq(rc, code, "rc %s, want %s: %s", sd_err_name(rc), sd_err_name(code), err.msg);
  cr_assert_not_null(strstr(err.msg, frag), "message '%s' lacks '%s'", err.msg, frag);
  cr_assert_eq(c.nfiles, 0);
  cr_assert_null(c.files);
  sd_ckpt_free(&c);
}

static void expect_bad(const char *frag) { expect_code(SHARDD_E_FORMAT, frag); }
/* Files beside the index or missing from it: their own code, so a loader can tell them from damage. */
static void expect_file_set(const char *frag) { expect_code(SHARDD_E_FILE_SET, frag); }

/* The folder reads, as a checkpoint of nfiles shards. */
static void expect_good(size_t nfiles) {
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_eq(c.nfiles, nfiles);
  sd_ckpt_free(&c);
}

/* ------------------------------------------------------------------------ *
 * Valid folders
 * ------------------------------------------------------------------------ */

TestSuite(ckpt, .init = mk_tmp, .fini = rm_tmp);

Test(ckpt, sharded_with_index) {
  good_shards();
  put_str(INDEX, "{\n  \"metadata\": {\n    \"total_size\": 27,\n    \"total_parameters\": 9\n  },\n"
                 "  " WM_OK "\n}\n");
  /* Files that are not this checkpoint's shards are left alone. */
  put_str("config.json", "{}");
  shard("optimizer.safetensors", S2, 1);
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.index_name, INDEX);
  cr_assert_str_eq(c.prefix, "model");
  cr_assert_eq(c.nfiles, 2);
  cr_assert_str_eq(c.files[0].name, F1);
  cr_assert_str_eq(c.files[1].name, F2);
  cr_assert_eq(c.files[0].h.ntensors, 2);
  cr_assert_eq(c.ntensors, 3);
  cr_assert_eq(c.total_size, 27);
  cr_assert_eq(c.total_parameters, 9);
  sd_ckpt_free(&c);
}

Test(ckpt, single_file_without_index) {
  shard("model.safetensors", S1, 2);
  put_str("config.json", "{}");
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_null(c.index_name);
  cr_assert_str_eq(c.prefix, "model");
  cr_assert_eq(c.nfiles, 1);
  cr_assert_eq(c.ntensors, 2);
  cr_assert_eq(c.total_size, 19);
  cr_assert_eq(c.total_parameters, 7);
  sd_ckpt_free(&c);
}

Test(ckpt, custom_prefix) {
  shard("adapter-00001-of-00002.safetensors", S1, 2);
  shard("adapter-00002-of-00002.safetensors", S2, 1);
  put_str("adapter.safetensors.index.json",
          "{\"metadata\":{\"total_size\":27},\"weight_map\":{"
          "\"a\":\"adapter-00001-of-00002.safetensors\",\"b\":\"adapter-00001-of-00002.safetensors\","
          "\"c\":\"adapter-00002-of-00002.safetensors\"}}");
  sd_ckpt c;
  sd_error err;
  cr_assert_eq(sd_ckpt_read(ckdir, &c, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.prefix, "adapter");
  cr_assert_eq(c.nfiles, 2);
  sd_ckpt_free(&c);
}

/* ------------------------------------------------------------------------ *
 * Which files are there
 * ------------------------------------------------------------------------ */

Test(ckpt, empty_folder) { expect_bad("no .safetensors file and no index"); }

Test(ckpt, several_files_without_index) {
  shard("a.safetensors", S1, 2);
  shard("b.safetensors", S2, 1);
  expect_bad("2 .safetensors files (a.safetensors, b.safetensors) but no *.safetensors.index.json");
}

Test(ckpt, two_index_files) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  put_str("other.safetensors.index.json", "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_bad("2 index files (model.safetensors.index.json, other.safetensors.index.json); "
             "expected one");
}

/* ------------------------------------------------------------------------ *
 * Stale and foreign files: a shard-named file the index does not name, a
 * named file missing, an index missing
 * ------------------------------------------------------------------------ */

Test(ckpt, missing_shard) {
  shard(F1, S1, 2);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set(INDEX ": weight_map names " F2 ", which does not exist");
}

Test(ckpt, stray_shard_not_in_index) {
  good_shards();
  shard("model-00003-of-00003.safetensors", S2, 1);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set("model-00003-of-00003.safetensors: not in the weight_map of " INDEX " (stale or foreign)");
}

Test(ckpt, stray_shard_of_another_count_not_in_index) {
  good_shards();
  shard("model-00001-of-00003.safetensors", S2, 1); /* an older save with three shards */
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set("model-00001-of-00003.safetensors: not in the weight_map of " INDEX);
}

Test(ckpt, stray_shard_with_six_digit_numbers) {
  good_shards();
  shard("model-100000-of-100001.safetensors", S2, 1);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set("model-100000-of-100001.safetensors: not in the weight_map of " INDEX);
}

Test(ckpt, stale_single_file_beside_index) {
  good_shards();
  shard("model.safetensors", S2, 1);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set("model.safetensors: not in the weight_map of " INDEX);
}

/* What save_pretrained and other tools put beside the shards, and names that only look like shards. */
Test(ckpt, non_shard_files_beside_the_index_are_normal) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  static const char *const beside[] = {
      "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
      "training_args.bin", "model.safetensors.bak", "adapter_model.safetensors",
      "optimizer-00001-of-00002.safetensors", /* another prefix */
      "model-extra.safetensors",              /* not the shard pattern */
      "model-0001-of-0002.safetensors",       /* four digits: not huggingface_hub's names */
      "model-00001-of-00002.safetensors.tmp", "model-00001-of-00002-safetensors",
      "xmodel-00001-of-00002.safetensors",
  };
  for (size_t i = 0; i < sizeof beside / sizeof beside[0]; i++) {
    if (strstr(beside[i], ".safetensors") && !strstr(beside[i], ".bak") && !strstr(beside[i], ".tmp"))
      shard(beside[i], S2, 1);
    else
      put_str(beside[i], "{}");
  }
  expect_good(2);
}

Test(ckpt, shards_without_their_index) {
  good_shards();
  expect_file_set(F1 ": a shard of a sharded checkpoint, but " INDEX " is missing");
}

Test(ckpt, one_shard_left_without_its_index) {
  shard(F2, S2, 1);
  expect_file_set(F2 ": a shard of a sharded checkpoint, but " INDEX " is missing");
}

Test(ckpt, stale_shard_beside_a_single_file) {
  shard("model.safetensors", S1, 2);
  shard("model-00002-of-00003.safetensors", S2, 1);
  put_str("config.json", "{}");
  expect_file_set("model-00002-of-00003.safetensors: a shard file beside the single-file checkpoint "
                  "model.safetensors (stale or foreign)");
}

Test(ckpt, single_file_beside_other_files_is_normal) {
  shard("model.safetensors", S1, 2);
  put_str("config.json", "{}");
  put_str("generation_config.json", "{}");
  put_str("model-00001-of-00002.json", "{}");
  expect_good(1);
}

Test(ckpt, the_first_stray_in_name_order_is_named) {
  good_shards();
  shard("model-00009-of-00009.safetensors", S2, 1);
  shard("model-00003-of-00003.safetensors", S2, 1);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_file_set("model-00003-of-00003.safetensors: not in the weight_map");
}

Test(ckpt, invalid_shard_is_named) {
  good_shards();
  static const char bad[] = "\x02\0\0\0\0\0\0\0{}x";
  put(F2, bad, sizeof bad - 1);
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_bad(F2 ": 1 trailing byte after the last tensor");
}

/* ------------------------------------------------------------------------ *
 * Index versus headers
 * ------------------------------------------------------------------------ */

Test(ckpt, total_size_wrong) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":28}," WM_OK "}");
  expect_bad(INDEX ": metadata.total_size is 28 but the tensors hold 27 bytes");
}

Test(ckpt, total_parameters_wrong) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27,\"total_parameters\":10}," WM_OK "}");
  expect_bad(INDEX ": metadata.total_parameters is 10 but the tensors hold only 9 parameters");
}

/* transformers' save_pretrained counts parameters, not persistent buffers (DeepSeek-V3's
 * e_score_correction_bias): fewer than the tensors hold is its index, and read. */
Test(ckpt, total_parameters_without_buffers) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27,\"total_parameters\":5}," WM_OK "}");
  expect_good(2);
}

Test(ckpt, header_tensor_missing_from_map) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"" F1 "\",\"c\":\"" F2
                 "\"}}");
  expect_bad(INDEX ": tensor 'b' is in " F1 " but not in weight_map");
}

Test(ckpt, map_points_to_wrong_file) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"" F1 "\",\"b\":\"" F2
                 "\",\"c\":\"" F2 "\"}}");
  expect_bad(INDEX ": tensor 'b' is in " F1 " but weight_map says " F2);
}

Test(ckpt, map_entry_not_in_its_file) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"" F1 "\",\"b\":\"" F1
                 "\",\"c\":\"" F2 "\",\"d\":\"" F2 "\"}}");
  expect_bad(INDEX ": weight_map says tensor 'd' is in " F2 ", which has no such tensor");
}

Test(ckpt, tensor_in_two_files) {
  static const spec S2b[] = {{"c", "F32", 4, 2}, {"b", "U8", 1, 3}};
  shard(F1, S1, 2);
  shard(F2, S2b, 2);
  put_str(INDEX, "{\"metadata\":{\"total_size\":30}," WM_OK "}");
  expect_bad(INDEX ": tensor 'b' is in both " F1 " and " F2);
}

Test(ckpt, names_compare_exactly) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"" F1 "\",\"B\":\"" F1
                 "\",\"c\":\"" F2 "\"}}");
  expect_bad(INDEX ": tensor 'b' is in " F1 " but not in weight_map");
}

/* ------------------------------------------------------------------------ *
 * The index document itself
 * ------------------------------------------------------------------------ */

Test(ckpt, index_json_hostility) {
  good_shards();
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"metadata\":{\"total_size\":27}," WM_OK "}");
  expect_bad(INDEX ": not valid JSON at byte");
  expect_bad("duplicate object key");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"" F1 "\",\"a\":\"" F2
                 "\"}}");
  expect_bad("duplicate object key");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK ",\"extra\":1}");
  expect_bad(INDEX ": unexpected top-level key 'extra'");
  put_str(INDEX, "{" WM_OK "}");
  expect_bad(INDEX ": missing 'metadata'");
  put_str(INDEX, "{\"metadata\":{}," WM_OK "}");
  expect_bad(INDEX ": metadata.total_size is missing");
  put_str(INDEX, "{\"metadata\":{\"total_size\":\"27\"}," WM_OK "}");
  expect_bad(INDEX ": metadata.total_size is not a non-negative integer");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27.0}," WM_OK "}");
  expect_bad(INDEX ": metadata.total_size is not a non-negative integer");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{}}");
  expect_bad(INDEX ": weight_map is empty");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":1}}");
  expect_bad(INDEX ": weight_map: tensor 'a' -> not a string");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"../" F1 "\"}}");
  expect_bad(INDEX ": weight_map: tensor 'a' -> '../" F1 "' is not a plain *.safetensors");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\":\"config.json\"}}");
  expect_bad("'config.json' is not a plain *.safetensors file name");
  put_str(INDEX, "[]");
  expect_bad(INDEX ": not a JSON object");
  put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK);
  expect_bad(INDEX ": not valid JSON");
  static const char bad[] = "{\"metadata\":{\"total_size\":27},\"weight_map\":{\"a\xfe\":\"" F1 "\"}}";
  put(INDEX, bad, sizeof bad - 1);
  expect_bad("UTF-8");
}

Test(ckpt, index_parse_is_pure) {
  const char *js = "{\"metadata\":{\"total_size\":5,\"total_parameters\":2,\"other\":\"x\"},"
                   "\"weight_map\":{\"z\":\"m-2.safetensors\",\"a\":\"m-1.safetensors\","
                   "\"m\":\"m-2.safetensors\"}}";
  sd_st_index ix;
  sd_error err;
  cr_assert_eq(sd_st_index_parse("i", js, strlen(js), &ix, &err), 0, "%s", err.msg);
  cr_assert_eq(ix.total_size, 5);
  cr_assert(ix.has_total_parameters);
  cr_assert_eq(ix.total_parameters, 2);
  cr_assert_eq(ix.nfiles, 2);
  cr_assert_str_eq(ix.files[0], "m-1.safetensors");
  cr_assert_str_eq(ix.files[1], "m-2.safetensors");
  cr_assert_eq(ix.nentries, 3);
  cr_assert_str_eq(ix.entries[0].tensor, "a");
  cr_assert_eq(ix.entries[0].file, 0);
  cr_assert_str_eq(ix.entries[1].tensor, "m");
  cr_assert_eq(ix.entries[1].file, 1);
  cr_assert_str_eq(ix.entries[2].tensor, "z");
  cr_assert_eq(ix.entries[2].file, 1);
  sd_st_index_free(&ix);
}

/* The index's own parse of js: 0, or the code with its message in msg. */
static int index_parse(const char *js, char *msg, size_t n) {
  sd_st_index ix;
  sd_error err = {0};
  int rc = sd_st_index_parse("i", js, strlen(js), &ix, &err);
  snprintf(msg, n, "%s", rc ? err.msg : "");
  if (!rc) sd_st_index_free(&ix);
  return rc;
}

#define WM_ONE "\"weight_map\":{\"a\":\"m-1.safetensors\"}"

/* Entries of metadata the reader does not read are walked past, yet a key repeated anywhere in them
 * is refused as jansson's loader refused it, naming the key. */
Test(ckpt, repeated_keys_inside_unknown_metadata) {
  static const struct {
    const char *js, *key;
  } bad[] = {
      {"{\"metadata\":{\"total_size\":5,\"extra\":{\"k\":1,\"k\":2}}," WM_ONE "}", "'k'"},
      {"{\"metadata\":{\"total_size\":5,\"extra\":[1,{\"x\":{\"deep\":[],\"deep\":{}}}]}," WM_ONE "}", "'deep'"},
      {"{\"metadata\":{\"total_size\":5,\"note\":\"1\",\"note\":\"2\"}," WM_ONE "}", "'note'"},
      {"{\"metadata\":{\"note\":\"1\",\"total_size\":5,\"total_size\":5}," WM_ONE "}", "'total_size'"},
      /* the same key spelled two ways: keys compare decoded */
      {"{\"metadata\":{\"total_size\":5,\"e\":{\"\\u00e9\":1,\"\xc3\xa9\":2}}," WM_ONE "}", "duplicate object key"},
  };
  char msg[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(index_parse(bad[i].js, msg, sizeof msg), SHARDD_E_FORMAT, "%s was taken", bad[i].js);
    cr_assert_not_null(strstr(msg, "duplicate object key"), "%s", msg);
    cr_assert_not_null(strstr(msg, bad[i].key), "'%s' does not name %s", msg, bad[i].key);
  }
  /* The same key in different objects is no repeat. */
  cr_assert_eq(index_parse("{\"metadata\":{\"total_size\":5,\"k\":{\"k\":{\"k\":1}},\"l\":[{\"k\":1},{\"k\":2}]},"
                           WM_ONE "}", msg, sizeof msg), 0, "%s", msg);

  /* Objects of many keys (a hash table past the first few) and objects nested in them: a repeat
   * among 5,000 keys is found, far apart, at any depth, and 5,000 distinct keys pass. */
  for (int repeat = 0; repeat < 3; repeat++) {
    size_t cap = 200000, n = 0;
    char *js = malloc(cap);
    n += (size_t)snprintf(js + n, cap - n, "{\"metadata\":{\"total_size\":5,\"big\":{");
    for (int k = 0; k < 5000; k++) {
      int key = repeat == 1 && k == 4999 ? 3 : k;
      if (repeat == 2 && k == 2500)
        n += (size_t)snprintf(js + n, cap - n, ",\"nest\":{\"a\":1,\"b\":{\"z\":0,\"z\":1}}");
      n += (size_t)snprintf(js + n, cap - n, "%s\"key%d\":%d", k ? "," : "", key, k);
    }
    snprintf(js + n, cap - n, "}}," WM_ONE "}");
    int rc = index_parse(js, msg, sizeof msg);
    if (repeat == 0) {
      cr_assert_eq(rc, 0, "%s", msg);
    } else {
      cr_assert_eq(rc, SHARDD_E_FORMAT);
      cr_assert_not_null(strstr(msg, repeat == 1 ? "duplicate object key 'key3'" : "duplicate object key 'z'"), "%s", msg);
    }
    free(js);
  }
}

Test(ckpt, not_a_folder) {
  sd_ckpt c;
  sd_error err;
  char path[160];
  snprintf(path, sizeof path, "%s/missing", tmpdir);
  cr_assert_eq(sd_ckpt_read(path, &c, &err), SHARDD_E_IO);
  cr_assert_not_null(strstr(err.msg, "cannot open the folder"), "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * Only regular files are opened for reading: a FIFO, a socket or a device
 * (or a symlink to one) is refused at once, never waited on
 * ------------------------------------------------------------------------ */
#include <sys/socket.h>
#include <sys/un.h>

/* name in ckdir replaced by: 0 a FIFO, 1 a symlink to a FIFO, 2 a symlink to /dev/zero, 3 a socket, 4 a folder. */
static int plant_special(const char *name, int kind) {
  char p[256], q[300];
  path_of(p, sizeof p, name);
  unlink(p);
  int keep = -1;
  if (kind == 0) cr_assert_eq(mkfifo(p, 0644), 0);
  if (kind == 1) {
    snprintf(q, sizeof q, "%s.fifo", p);
    cr_assert_eq(mkfifo(q, 0644), 0);
    cr_assert_eq(symlink(q, p), 0);
  }
  if (kind == 2) cr_assert_eq(symlink("/dev/zero", p), 0);
  if (kind == 3) {
    keep = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(p), sizeof a.sun_path);
    memcpy(a.sun_path, p, strlen(p) + 1);
    cr_assert_eq(bind(keep, (struct sockaddr *)&a, sizeof a), 0);
  }
  if (kind == 4) cr_assert_eq(mkdir(p, 0755), 0);
  return keep;
}

Test(ckpt, what_is_not_a_regular_file_is_refused_without_blocking) {
  static const char *const kinds[] = {"a fifo", "a fifo", "a character device", "a socket", "a folder"};
  const char *victims[] = {F2, INDEX};
  for (int v = 0; v < 2; v++)
    for (int k = 0; k < 5; k++) {
      good_shards();
      put_str(INDEX, "{\"metadata\":{\"total_size\":27}," WM_OK "}");
      char p[256], q[300];
      path_of(p, sizeof p, victims[v]);
      int keep = plant_special(victims[v], k);
      /* a blocking open of a FIFO with no writer never returns: the test would hang, not fail */
      alarm(10);
      char want[128];
      snprintf(want, sizeof want, "%s: not a regular file (%s)", victims[v], kinds[k]);
      expect_bad(want);
      sd_st_header h;
      sd_error err;
      int rc = sd_st_read_file(p, &h, &err);
      alarm(0);
      cr_assert_eq(rc, SHARDD_E_FORMAT, "%s", err.msg);
      cr_assert_not_null(strstr(err.msg, "not a regular file"), "%s", err.msg);
      if (keep >= 0) close(keep);
      snprintf(q, sizeof q, "%s.fifo", p);
      unlink(q);
      if (k == 4) rmdir(p);
      else unlink(p);
    }
}
