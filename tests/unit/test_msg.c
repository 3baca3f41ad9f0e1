/* Message codec: request parsing and field getters, with the error codes and messages clients see. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_msg.h"
#include "sd_request.h"

static json_t *obj(const char *text) {
  json_t *v = NULL;
  sd_error err = {0};
  int rc = sd_msg_parse(text, strlen(text), &v, &err);
  cr_assert_eq(rc, 0, "parse failed: %s", err.msg);
  return v;
}

static void parse_fails(const char *text, const char *msg_prefix) {
  json_t *v = (json_t *)1;
  sd_error err = {0};
  cr_assert_eq(sd_msg_parse(text, strlen(text), &v, &err), SHARDD_E_BAD_REQUEST, "%s", text);
  cr_assert_null(v);
  cr_assert_eq(strncmp(err.msg, msg_prefix, strlen(msg_prefix)), 0, "message: %s", err.msg);
}

/* ---------------------------------------------------------------- parse */
Test(msg, parse_accepts_object) {
  json_t *v = obj("{\"op\":\"hello\",\"id\":7,\"proto\":1}");
  const char *op = NULL;
  sd_error err = {0};
  cr_assert_eq(sd_msg_op(v, &op, &err), 0);
  cr_assert_str_eq(op, "hello");
  json_decref(v);
}

Test(msg, parse_refuses_garbage) {
  parse_fails("hello", "invalid JSON at column");
  parse_fails("{\"op\":", "invalid JSON at column");
  parse_fails("", "invalid JSON at column");
  parse_fails("{} {}", "invalid JSON at column");
}

Test(msg, parse_refuses_non_objects) {
  parse_fails("[1,2]", "a request must be a JSON object");
  parse_fails("\"op\"", "a request must be a JSON object");
  parse_fails("3", "a request must be a JSON object");
}

Test(msg, parse_refuses_duplicate_keys_bad_utf8_and_nul) {
  parse_fails("{\"op\":\"a\",\"op\":\"b\"}", "invalid JSON");
  parse_fails("{\"op\":\"\xff\"}", "invalid JSON");
  parse_fails("{\"op\":\"a\\u0000b\"}", "invalid JSON");
}

Test(msg, op_missing_or_not_string) {
  sd_error err = {0};
  const char *op;
  json_t *v = obj("{\"id\":1}");
  cr_assert_eq(sd_msg_op(v, &op, &err), SHARDD_E_BAD_REQUEST);
  cr_assert_str_eq(err.msg, "missing field 'op'");
  json_decref(v);
  v = obj("{\"op\":5}");
  cr_assert_eq(sd_msg_op(v, &op, &err), SHARDD_E_BAD_REQUEST);
  cr_assert_str_eq(err.msg, "field 'op' must be a string");
  json_decref(v);
}

/* ---------------------------------------------------------------- strings */
Test(msg, str_present_absent_null_wrong_type) {
  json_t *v = obj("{\"a\":\"x\\u00e9y\",\"n\":null,\"i\":3}");
  sd_error err = {0};
  const char *s = "unchanged";
  size_t len = 0;
  cr_assert_eq(sd_msg_str(v, "a", 1, &s, &len, &err), 1);
  cr_assert_str_eq(s, "x\xc3\xa9y");
  cr_assert_eq(len, 4);
  s = "unchanged";
  cr_assert_eq(sd_msg_str(v, "missing", 0, &s, NULL, &err), 0);
  cr_assert_eq(sd_msg_str(v, "n", 0, &s, NULL, &err), 0);
  cr_assert_str_eq(s, "unchanged");
  cr_assert_eq(sd_msg_str(v, "missing", 1, &s, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "missing field 'missing'");
  cr_assert_eq(sd_msg_str(v, "i", 0, &s, NULL, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "field 'i' must be a string");
  json_decref(v);
}

/* ---------------------------------------------------------------- integers */
Test(msg, u64_accepts_integers_and_integral_reals) {
  json_t *v = obj("{\"a\":0,\"b\":9007199254740992,\"c\":4.0,\"d\":1e3}");
  sd_error err = {0};
  uint64_t x = 1;
  cr_assert_eq(sd_msg_u64(v, "a", 1, 0, &x, &err), 1);
  cr_assert_eq(x, 0);
  cr_assert_eq(sd_msg_u64(v, "b", 1, 0, &x, &err), 1);
  cr_assert_eq(x, 9007199254740992ULL);
  cr_assert_eq(sd_msg_u64(v, "c", 1, 0, &x, &err), 1);
  cr_assert_eq(x, 4);
  cr_assert_eq(sd_msg_u64(v, "d", 1, 0, &x, &err), 1);
  cr_assert_eq(x, 1000);
  json_decref(v);
}

static void u64_fails(const char *text, uint64_t max, const char *msg) {
  json_t *v = obj(text);
  sd_error err = {0};
  uint64_t x = 77;
  cr_assert_eq(sd_msg_u64(v, "n", 1, max, &x, &err), SHARDD_E_INVALID_ARGUMENT, "%s", text);
  cr_assert_eq(err.code, SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, msg);
  cr_assert_eq(x, 77);
  json_decref(v);
}

Test(msg, u64_refuses_negative_fractional_huge_and_wrong_types) {
  u64_fails("{\"n\":-1}", 0, "field 'n' must not be negative");
  u64_fails("{\"n\":-0.5}", 0, "field 'n' must not be negative");
  u64_fails("{\"n\":1.5}", 0, "field 'n' must be an integer");
  u64_fails("{\"n\":9007199254740993}", 0, "field 'n' must be at most 9007199254740992");
  u64_fails("{\"n\":1e300}", 0, "field 'n' must be at most 9007199254740992");
  u64_fails("{\"n\":\"5\"}", 0, "field 'n' must be a non-negative integer");
  u64_fails("{\"n\":true}", 0, "field 'n' must be a non-negative integer");
  u64_fails("{\"n\":[1]}", 0, "field 'n' must be a non-negative integer");
  u64_fails("{\"n\":8}", 7, "field 'n' must be at most 7");
  u64_fails("{}", 0, "missing field 'n'");
}

Test(msg, u64_optional_absent_keeps_default) {
  json_t *v = obj("{\"n\":null}");
  sd_error err = {0};
  uint64_t x = 5;
  cr_assert_eq(sd_msg_u64(v, "n", 0, 0, &x, &err), 0);
  cr_assert_eq(sd_msg_u64(v, "m", 0, 0, &x, &err), 0);
  cr_assert_eq(x, 5);
  json_decref(v);
}

Test(msg, integer_too_big_for_the_parser_is_a_bad_request) {
  parse_fails("{\"n\":18446744073709551616}", "invalid JSON");
}

/* ---------------------------------------------------------------- bools */
Test(msg, bool_field) {
  json_t *v = obj("{\"t\":true,\"f\":false,\"n\":1}");
  sd_error err = {0};
  int b = -1;
  cr_assert_eq(sd_msg_bool(v, "t", 1, &b, &err), 1);
  cr_assert_eq(b, 1);
  cr_assert_eq(sd_msg_bool(v, "f", 1, &b, &err), 1);
  cr_assert_eq(b, 0);
  cr_assert_eq(sd_msg_bool(v, "n", 1, &b, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "field 'n' must be true or false");
  json_decref(v);
}

/* ---------------------------------------------------------------- arrays */
Test(msg, u64_array_reads_values) {
  json_t *v = obj("{\"shape\":[4,0,1024],\"empty\":[]}");
  sd_error err = {0};
  uint64_t a[4] = {0};
  size_t n = 99;
  cr_assert_eq(sd_msg_u64_array(v, "shape", 1, 4, 0, a, &n, &err), 1);
  cr_assert_eq(n, 3);
  cr_assert_eq(a[0], 4);
  cr_assert_eq(a[1], 0);
  cr_assert_eq(a[2], 1024);
  cr_assert_eq(sd_msg_u64_array(v, "empty", 1, 4, 0, a, &n, &err), 1);
  cr_assert_eq(n, 0);
  json_decref(v);
}

static void array_fails(const char *text, const char *msg) {
  json_t *v = obj(text);
  sd_error err = {0};
  uint64_t a[3];
  size_t n = 0;
  cr_assert_eq(sd_msg_u64_array(v, "shape", 1, 3, 0, a, &n, &err), SHARDD_E_INVALID_ARGUMENT, "%s",
               text);
  cr_assert_str_eq(err.msg, msg);
  json_decref(v);
}

Test(msg, u64_array_errors_name_the_entry) {
  array_fails("{\"shape\":5}", "field 'shape' must be an array of integers");
  array_fails("{\"shape\":[1,2,3,4]}", "field 'shape' has 4 entries, at most 3 allowed");
  array_fails("{\"shape\":[1,-2]}", "field 'shape[1]' must not be negative");
  array_fails("{\"shape\":[1,2,2.5]}", "field 'shape[2]' must be an integer");
  array_fails("{\"shape\":[\"1\"]}", "field 'shape[0]' must be a non-negative integer");
}

/* ---------------------------------------------------------------- maps */
Test(msg, str_map_reads_pairs_in_order) {
  json_t *v = obj("{\"metadata\":{\"b\":\"2\",\"a\":\"1\"}}");
  sd_error err = {0};
  sd_kv *kv = NULL;
  size_t n = 0;
  cr_assert_eq(sd_msg_str_map(v, "metadata", 0, 8, &kv, &n, &err), 1);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(kv[0].key, "b");
  cr_assert_str_eq(kv[0].value, "2");
  cr_assert_str_eq(kv[1].key, "a");
  cr_assert_str_eq(kv[1].value, "1");
  free(kv);
  json_decref(v);
}

Test(msg, str_map_errors) {
  json_t *v = obj("{\"m\":{\"k\":1},\"l\":[],\"big\":{\"a\":\"\",\"b\":\"\"}}");
  sd_error err = {0};
  sd_kv *kv = NULL;
  size_t n = 0;
  cr_assert_eq(sd_msg_str_map(v, "m", 0, 8, &kv, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "field 'm.k' must be a string");
  cr_assert_eq(sd_msg_str_map(v, "l", 0, 8, &kv, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "field 'l' must be an object of strings");
  cr_assert_eq(sd_msg_str_map(v, "big", 0, 1, &kv, &n, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "field 'big' has 2 entries, at most 1 allowed");
  cr_assert_eq(sd_msg_str_map(v, "none", 0, 1, &kv, &n, &err), 0);
  cr_assert_null(kv);
  json_decref(v);
}

/* ---------------------------------------------------------------- replies */
static void dumps_to(json_t *msg, const char *want) {
  size_t len = 0;
  char *s = sd_msg_dump(msg, &len);
  cr_assert_not_null(s);
  cr_assert_eq(len, strlen(want));
  cr_assert_str_eq(s, want);
  free(s);
  json_decref(msg);
}

Test(msg, ok_reply_echoes_any_id) {
  json_t *id = json_pack("{s:i}", "x", 1);
  dumps_to(sd_msg_ok(id), "{\"id\":{\"x\":1},\"ok\":true}\n");
  json_decref(id);
  dumps_to(sd_msg_ok(NULL), "{\"id\":null,\"ok\":true}\n");
}

Test(msg, error_reply_has_code_and_message) {
  json_t *id = json_integer(3);
  dumps_to(sd_msg_error(id, SHARDD_E_GAP, "tensor 'w' has a gap at [1]"),
           "{\"id\":3,\"ok\":false,\"error\":{\"code\":\"gap\",\"message\":\"tensor 'w' has a gap at [1]\"}}\n");
  dumps_to(sd_msg_error(id, SHARDD_E_ABORTED, NULL),
           "{\"id\":3,\"ok\":false,\"error\":{\"code\":\"aborted\",\"message\":\"save aborted\"}}\n");
  sd_error err = {0};
  sd_fail(&err, SHARDD_E_MISMATCH, "tensor '%s' differs", "a");
  dumps_to(sd_msg_error_from(id, &err),
           "{\"id\":3,\"ok\":false,\"error\":{\"code\":\"mismatch\",\"message\":\"tensor 'a' differs\"}}\n");
  json_decref(id);
}

Test(msg, error_message_with_broken_utf8_is_repaired) {
  /* A message truncated inside a two-byte character. */
  dumps_to(sd_msg_error(NULL, SHARDD_E_INTERNAL, "ab\xc3"),
           "{\"id\":null,\"ok\":false,\"error\":{\"code\":\"internal\",\"message\":\"ab?\"}}\n");
  dumps_to(sd_msg_string_lossy("\xed\xa0\x80x\xf4\x90\x80\x80\xc3\xa9"), "\"???x????\xc3\xa9\"\n");
}

Test(msg, event) {
  dumps_to(sd_msg_event("released", "s1"), "{\"event\":\"released\",\"save\":\"s1\"}\n");
}

/* begin's deadlines: absent (the daemon's default), 0 (never), a value, or refused naming the field. */
Test(msg, begin_deadline_fields) {
  json_t *v = obj("{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1}");
  sd_req_begin b = {0};
  sd_error err = {0};
  cr_assert_eq(sd_req_begin_fields(v, &b, &err), 0, "%s", err.msg);
  cr_assert_eq(b.has_join_timeout, 0);
  cr_assert_eq(b.has_idle_timeout, 0);
  free(b.metadata);
  json_decref(v);

  v = obj("{\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"join_timeout\":0,\"idle_timeout\":2.0}");
  memset(&b, 0, sizeof b);
  cr_assert_eq(sd_req_begin_fields(v, &b, &err), 0, "%s", err.msg);
  cr_assert_eq(b.has_join_timeout, 1);
  cr_assert_eq(b.join_timeout, 0);
  cr_assert_eq(b.has_idle_timeout, 1);
  cr_assert_eq(b.idle_timeout, 2);
  free(b.metadata);
  json_decref(v);

  const char *bad[] = {"{\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"join_timeout\":-1}",
                       "{\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"idle_timeout\":\"5\"}",
                       "{\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"join_timeout\":604801}"};
  const char *field[] = {"join_timeout", "idle_timeout", "join_timeout"};
  for (size_t i = 0; i < 3; i++) {
    v = obj(bad[i]);
    memset(&b, 0, sizeof b);
    sd_error_clear(&err);
    cr_assert_eq(sd_req_begin_fields(v, &b, &err), SHARDD_E_INVALID_ARGUMENT, "%s", bad[i]);
    cr_assert(strstr(err.msg, field[i]), "'%s' does not name %s", err.msg, field[i]);
    free(b.metadata);
    json_decref(v);
  }
}
