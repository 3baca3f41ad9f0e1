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
