/* The index JSON: byte-identical to Python's json.dumps(indent=2, sort_keys=True), consistent with the plan. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

static sd_tensor u8(const char *name, uint64_t bytes) {
  sd_tensor t = {.name = name, .dtype = SD_DT_U8, .ndim = 1, .index = -1};
  t.shape[0] = bytes;
  return t;
}

/* Expected texts were produced by CPython 3:
 *   json.dumps({"metadata": {...}, "weight_map": {...}}, indent=2, sort_keys=True) + "\n" */
Test(index, matches_python_byte_for_byte) {
  sd_tensor t[] = {u8("b", 4), u8("\xf0\x9f\x98\x80q\"\\", 4), u8("a", 4), u8("\xc3\xa9", 4)};
  sd_plan p;
  sd_plan_opts o = {.max_shard_size = 8};
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 4, &o, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, 2);
  size_t len = 0;
  char *ix = sd_index_encode(&p, t, &len, &err);
  cr_assert_not_null(ix, "%s", err.msg);
  const char *want =
      "{\n  \"metadata\": {\n    \"total_parameters\": 16,\n    \"total_size\": 16\n  },\n"
      "  \"weight_map\": {\n    \"a\": \"model-00001-of-00002.safetensors\",\n"
      "    \"b\": \"model-00001-of-00002.safetensors\",\n"
      "    \"\\u00e9\": \"model-00002-of-00002.safetensors\",\n"
      "    \"\\ud83d\\ude00q\\\"\\\\\": \"model-00002-of-00002.safetensors\"\n  }\n}\n";
  cr_assert_str_eq(ix, want);
  cr_assert_eq(len, strlen(want));
  free(ix);
  sd_plan_free(&p);
}

Test(index, empty_weight_map) {
  sd_plan p;
  cr_assert_eq(sd_plan_build(&p, NULL, 0, NULL, NULL), 0);
  size_t len;
  char *ix = sd_index_encode(&p, NULL, &len, NULL);
  cr_assert_str_eq(ix, "{\n  \"metadata\": {\n    \"total_parameters\": 0,\n    \"total_size\": 0\n"
                       "  },\n  \"weight_map\": {}\n}\n");
  free(ix);
  sd_plan_free(&p);
}

Test(index, ascii_escaping_matches_python_at_the_edges) {
  sd_buf b = {0};
  const char s[] = "\x7f~ \xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
  sd_buf_json_str_ascii(&b, s, sizeof s - 1);
  sd_buf_putc(&b, '\0');
  /* json.dumps("\x7f~ \u0080\u07ff\u0800\uffff\U00010000\U0010ffff") */
  cr_assert_str_eq(b.p, "\"\\u007f~ \\u0080\\u07ff\\u0800\\uffff\\ud800\\udc00\\udbff\\udfff\"");
  free(b.p);
  b = (sd_buf){0};
  sd_buf_json_str_ascii(&b, "\b\f\n\r\t\x01\x1f/", 8);
  sd_buf_putc(&b, '\0');
  cr_assert_str_eq(b.p, "\"\\b\\f\\n\\r\\t\\u0001\\u001f/\"");
  free(b.p);
}

Test(index, big_plan_is_consistent_and_sorted) {
  enum { N = 3000 };
  static char names[N][48];
  static sd_tensor t[N];
  srand(5);
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "model.layers.%d.w%d", rand() % 500, i);
    t[i] = u8(names[i], (uint64_t)(rand() % 100));
  }
  sd_plan p;
  sd_plan_opts o = {.max_shard_size = 2000};
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, N, &o, &err), 0, "%s", err.msg);
  size_t len;
  char *ix = sd_index_encode(&p, t, &len, &err);
  json_error_t jerr;
  json_t *root = json_loadb(ix, len, JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(root, "%s", jerr.text);
  cr_assert_eq(json_object_size(root), 2);
  json_t *wm = json_object_get(root, "weight_map");
  cr_assert_eq(json_object_size(wm), N);
  const char *prev = "";
  const char *key;
  json_t *v;
  json_object_foreach(wm, key, v) {
    cr_assert_lt(strcmp(prev, key), 0);
    prev = key;
  }
  for (int i = 0; i < N; i++)
    cr_assert_str_eq(json_string_value(json_object_get(wm, names[i])), p.files[p.loc[i].file].name);
  json_t *md = json_object_get(root, "metadata");
  cr_assert_eq((uint64_t)json_integer_value(json_object_get(md, "total_size")), p.total_size);
  /* Round trip through jansson's own pretty printer gives the same text. */
  char *again = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
  cr_assert_eq(strncmp(again, ix, len - 1), 0);
  free(again);
  json_decref(root);
  free(ix);
  sd_plan_free(&p);
}

/* json.dumps(indent=2, sort_keys=True) of the same index with the checksum map, as CPython 3 prints it. */
Test(index, checksum_map_matches_python_and_is_filled_in_place) {
  sd_tensor t[] = {u8("b", 4), u8("a", 4), u8("\xc3\xa9", 4)};
  sd_plan p;
  sd_plan_opts o = {.max_shard_size = 8, .checksums = 1, .prefix = "m\xc3\xa9"};
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 3, &o, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, 2);
  cr_assert_eq(p.files[0].sum_at, 0, "only a single file carries its checksum in its header");
  size_t len = 0;
  char *ix = sd_index_encode(&p, t, &len, &err);
  cr_assert_not_null(ix, "%s", err.msg);
  uint32_t crcs[] = {0xe3069283u, 0x0000000au};
  cr_assert_eq(sd_index_put_sums(ix, len, &p, crcs, &err), 0, "%s", err.msg);
  const char *want =
      "{\n  \"metadata\": {\n    \"shardd_data_crc32c\": {\n"
      "      \"m\\u00e9-00001-of-00002.safetensors\": \"e3069283\",\n"
      "      \"m\\u00e9-00002-of-00002.safetensors\": \"0000000a\"\n    },\n"
      "    \"total_parameters\": 12,\n    \"total_size\": 12\n  },\n"
      "  \"weight_map\": {\n    \"a\": \"m\\u00e9-00001-of-00002.safetensors\",\n"
      "    \"b\": \"m\\u00e9-00001-of-00002.safetensors\",\n"
      "    \"\\u00e9\": \"m\\u00e9-00002-of-00002.safetensors\"\n  }\n}\n";
  cr_assert_str_eq(ix, want);
  cr_assert_eq(len, strlen(want));
  /* an index without the map refuses to be filled */
  p.checksums = 0;
  char *plain = sd_index_encode(&p, t, &len, &err);
  p.checksums = 1;
  cr_assert_neq(sd_index_put_sums(plain, len, &p, crcs, &err), 0);
  cr_assert_eq(err.code, SHARDD_E_INTERNAL);
  free(plain);
  free(ix);
  sd_plan_free(&p);
}

Test(index, a_single_file_carries_its_checksum_in_its_metadata) {
  sd_tensor t[] = {u8("w", 4)};
  sd_kv md[] = {{"a", "1"}, {"z", "2"}};
  sd_plan p;
  sd_plan_opts o = {.checksums = 1, .metadata = md, .nmetadata = 2};
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nfiles, 1);
  cr_assert_eq(p.needs_index, 0);
  cr_assert_gt(p.files[0].sum_at, 8);
  sd_header_put_sum(&p.files[0], p.files[0].header, 0xdeadbeefu);
  json_error_t je;
  json_t *h = json_loadb(p.files[0].header + 8, p.files[0].header_size - 8, 0, &je);
  cr_assert_not_null(h, "%s", je.text);
  json_t *m = json_object_get(h, "__metadata__");
  cr_assert_str_eq(json_string_value(json_object_get(m, "shardd_data_crc32c")), "deadbeef");
  cr_assert_str_eq(json_string_value(json_object_get(m, "format")), "pt");
  cr_assert_str_eq(json_string_value(json_object_get(m, "z")), "2");
  json_decref(h);
  sd_plan_free(&p);
  /* the key is shardd's: a caller's pair of it (metadata read back from an earlier checkpoint) is
   * dropped, as "format" is forced: its value could only be stale */
  sd_kv mine[] = {{"shardd_data_crc32c", "0badc0de"}, {"k", "v"}};
  o.metadata = mine;
  o.nmetadata = 2;
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), 0, "%s", err.msg);
  sd_header_put_sum(&p.files[0], p.files[0].header, 0x12345678u);
  h = json_loadb(p.files[0].header + 8, p.files[0].header_size - 8, 0, &je);
  m = json_object_get(h, "__metadata__");
  cr_assert_str_eq(json_string_value(json_object_get(m, "shardd_data_crc32c")), "12345678");
  cr_assert_str_eq(json_string_value(json_object_get(m, "k")), "v");
  json_decref(h);
  sd_plan_free(&p);
  o.checksums = 0;
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), 0, "%s", err.msg);
  cr_assert_null(strstr(p.files[0].header + 8, "shardd_data_crc32c"), "a stale checksum kept with checksums off");
  sd_plan_free(&p);
}

/* Past 99,999 files the numbers widen and plan order stops being name
 * order: the map still comes sorted, as sort_keys sorts it, and each file
 * gets its own checksum. */
Test(index, checksum_map_is_in_name_order_whatever_the_plan_order) {
  sd_plan_file files[3] = {{.name = (char *)"model-99999-of-100001.safetensors"},
                           {.name = (char *)"model-100000-of-100001.safetensors"},
                           {.name = (char *)"model-100001-of-100001.safetensors"}};
  sd_plan p = {.nfiles = 3, .files = files, .checksums = 1, .index_name = (char *)"model.safetensors.index.json"};
  size_t len = 0;
  sd_error err = {0};
  char *ix = sd_index_encode(&p, NULL, &len, &err);
  cr_assert_not_null(ix, "%s", err.msg);
  uint32_t crcs[] = {0x99999u, 0x100000u, 0x100001u};
  cr_assert_eq(sd_index_put_sums(ix, len, &p, crcs, &err), 0, "%s", err.msg);
  const char *want = "    \"shardd_data_crc32c\": {\n"
                     "      \"model-100000-of-100001.safetensors\": \"00100000\",\n"
                     "      \"model-100001-of-100001.safetensors\": \"00100001\",\n"
                     "      \"model-99999-of-100001.safetensors\": \"00099999\"\n    },\n";
  cr_assert(strstr(ix, want), "%s", ix);
  free(ix);
}
