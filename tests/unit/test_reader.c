/* Strict safetensors reader: valid files parse exactly, and every hostile input is refused with a precise message. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_reader.h"

/* ------------------------------------------------------------------------ *
 * Building files in memory
 * ------------------------------------------------------------------------ */

/* 8-byte little-endian length + the header bytes given (which may hold a NUL)
 * + ndata data bytes (0, 1, 2, ... mod 251). */
static unsigned char *mk_raw(const char *json, size_t jlen, size_t ndata, size_t *len) {
  *len = 8 + jlen + ndata;
  unsigned char *b = malloc(*len ? *len : 1);
  cr_assert_not_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)jlen >> (8 * i));
  memcpy(b + 8, json, jlen);
  for (size_t i = 0; i < ndata; i++) b[8 + jlen + i] = (unsigned char)(i % 251);
  return b;
}

static unsigned char *mk(const char *json, size_t ndata, size_t *len) {
  return mk_raw(json, strlen(json), ndata, len);
}

static int parse_raw(const char *json, size_t jlen, size_t ndata, sd_st_header *h, sd_error *err) {
  size_t len;
  unsigned char *b = mk_raw(json, jlen, ndata, &len);
  sd_error_clear(err);
  int rc = sd_st_parse("t.safetensors", b, len, len, h, err);
  free(b);
  return rc;
}

static void expect_fail_raw(const char *json, size_t jlen, size_t ndata, const char *frag) {
  sd_st_header h;
  sd_error err;
  int rc = parse_raw(json, jlen, ndata, &h, &err);
  cr_assert_eq(rc, SHARDD_E_FORMAT, "expected FORMAT for %s, got %d (%s)", json, rc, err.msg);
  cr_assert_eq(err.code, SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, frag), "message '%s' lacks '%s'", err.msg, frag);
  cr_assert_not_null(strstr(err.msg, "t.safetensors: "), "message '%s' lacks the file", err.msg);
  cr_assert_eq(h.ntensors, 0);
  cr_assert_null(h.tensors);
  sd_st_header_free(&h);
}

static void expect_fail(const char *json, size_t ndata, const char *frag) {
  expect_fail_raw(json, strlen(json), ndata, frag);
}

/* ------------------------------------------------------------------------ *
 * Valid files
 * ------------------------------------------------------------------------ */

Test(reader, parses_tensors_metadata_and_sorts_by_offset) {
  const char *js =
      "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
      "\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
  sd_st_header h;
  sd_error err;
  cr_assert_eq(parse_raw(js, strlen(js), 28, &h, &err), 0, "%s", err.msg);
  cr_assert_eq(h.header_len, strlen(js));
  cr_assert_eq(h.data_start, 8 + strlen(js));
  cr_assert_eq(h.data_size, 28);
  cr_assert_eq(h.ntensors, 2);
  cr_assert_str_eq(h.tensors[0].name, "a");
  cr_assert_eq(h.tensors[0].dtype, SD_DT_F32);
  cr_assert_eq(h.tensors[0].ndim, 1);
  cr_assert_eq(h.tensors[0].shape[0], 4);
  cr_assert_eq(h.tensors[0].numel, 4);
  cr_assert_eq(h.tensors[0].begin, 0);
  cr_assert_eq(h.tensors[0].end, 16);
  cr_assert_str_eq(h.tensors[1].name, "b");
  cr_assert_eq(h.tensors[1].dtype, SD_DT_BF16);
  cr_assert_eq(h.tensors[1].ndim, 2);
  cr_assert_eq(h.tensors[1].shape[1], 3);
  cr_assert_eq(h.tensors[1].begin, 16);
  cr_assert_eq(h.total_parameters, 10);
  cr_assert_eq(h.nmeta, 2);
  cr_assert_str_eq(h.meta[0].key, "format");
  cr_assert_str_eq(h.meta[0].value, "pt");
  cr_assert_str_eq(h.meta[1].key, "k");
  cr_assert_str_eq(h.meta[1].value, "v");
  cr_assert_eq(sd_st_find(&h, "b"), &h.tensors[1]);
  cr_assert_null(sd_st_find(&h, "c"));
  sd_st_header_free(&h);
}

Test(reader, scalar_zero_size_and_space_padding) {
  /* Zero-size tensors sit anywhere a tensor boundary is, even at the end. */
  const char *js =
      "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"z\":{\"dtype\":\"I32\",\"shape\":[3,0,2],\"data_offsets\":[8,8]},"
      "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}      ";
  sd_st_header h;
  sd_error err;
  cr_assert_eq(parse_raw(js, strlen(js), 8, &h, &err), 0, "%s", err.msg);
  cr_assert_eq(h.ntensors, 3);
  cr_assert_str_eq(h.tensors[0].name, "s");
  cr_assert_eq(h.tensors[0].ndim, 0);
  cr_assert_eq(h.tensors[0].numel, 1);
  cr_assert_str_eq(h.tensors[1].name, "e");
  cr_assert_str_eq(h.tensors[2].name, "z");
  cr_assert_eq(h.tensors[2].numel, 0);
  cr_assert_eq(h.total_parameters, 1);
  cr_assert_eq(h.nmeta, 0);
  sd_st_header_free(&h);
}

Test(reader, empty_header_object_and_every_dtype) {
  sd_st_header h;
  sd_error err;
  cr_assert_eq(parse_raw("{}", 2, 0, &h, &err), 0, "%s", err.msg);
  cr_assert_eq(h.ntensors, 0);
  sd_st_header_free(&h);
  for (int d = 0; d < SD_DT__COUNT; d++) {
    char js[256];
    unsigned sz = sd_dtype_size((sd_dtype)d);
    snprintf(js, sizeof js, "{\"x\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%u]}}",
             sd_dtype_name((sd_dtype)d), 3 * sz);
    cr_assert_eq(parse_raw(js, strlen(js), 3 * sz, &h, &err), 0, "%s: %s", js, err.msg);
    cr_assert_eq(h.tensors[0].dtype, (sd_dtype)d);
    sd_st_header_free(&h);
  }
}

/* ------------------------------------------------------------------------ *
 * The length prefix
 * ------------------------------------------------------------------------ */

Test(reader, file_shorter_than_prefix) {
  unsigned char b[5] = {2, 0, 0, 0, 0};
  sd_st_header h;
  sd_error err;
  cr_assert_eq(sd_st_parse("t.safetensors", b, 5, 5, &h, &err), SHARDD_E_FORMAT);
  cr_assert_str_eq(err.msg,
                   "t.safetensors: file is 5 bytes, too short for the 8-byte header length");
  cr_assert_eq(sd_st_parse("t.safetensors", b, 0, 0, &h, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, "file is 0 bytes"));
}

Test(reader, header_length_over_the_limit) {
  unsigned char b[16] = {0};
  uint64_t hl = SD_HEADER_MAX + 1;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
  sd_st_header h;
  sd_error err;
  /* The limit is checked before the file size, so no giant allocation happens. */
  cr_assert_eq(sd_st_parse("t.safetensors", b, 16, UINT64_MAX, &h, &err), SHARDD_E_FORMAT);
  cr_assert_str_eq(err.msg, "t.safetensors: header length 100000001 exceeds the limit of "
                            "100000000 bytes");
  for (int i = 0; i < 8; i++) b[i] = 0xff;
  cr_assert_eq(sd_st_parse("t.safetensors", b, 16, 16, &h, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, "exceeds the limit"));
}

Test(reader, header_length_past_the_end) {
  const char *js = "{}";
  size_t len;
  unsigned char *b = mk(js, 0, &len);
  b[0] = 3; /* one byte more than the file holds */
  sd_st_header h;
  sd_error err;
  cr_assert_eq(sd_st_parse("t.safetensors", b, len, len, &h, &err), SHARDD_E_FORMAT);
  cr_assert_str_eq(err.msg,
                   "t.safetensors: header length 3 runs past the end of the file (10 bytes)");
  free(b);
}

Test(reader, buffer_shorter_than_header) {
  size_t len;
  unsigned char *b = mk("{}", 0, &len);
  sd_st_header h;
  sd_error err;
  cr_assert_eq(sd_st_parse("t.safetensors", b, 9, len, &h, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, "only 1 of the 2 header bytes given"), "%s", err.msg);
  free(b);
}

Test(reader, header_must_start_with_brace) {
  expect_fail(" {}", 0, "header does not start with '{'");
  expect_fail("[]", 0, "header does not start with '{'");
  expect_fail("", 0, "header does not start with '{'");
  expect_fail("", 4, "header does not start with '{'");
}

/* ------------------------------------------------------------------------ *
 * JSON-level hostility
 * ------------------------------------------------------------------------ */

Test(reader, duplicate_keys_anywhere) {
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
              2, "duplicate object key");
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
              "duplicate object key");
  expect_fail("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate object key");
  /* An escape spelling the same key is the same key. */
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"\\u0061\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
              2, "duplicate object key");
}

Test(reader, bad_utf8_and_nul) {
  const char bad_key[] = "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_raw(bad_key, sizeof bad_key - 1, 1, "not valid JSON");
  expect_fail_raw(bad_key, sizeof bad_key - 1, 1, "(invalid UTF-8)");
  const char overlong[] = "{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_raw(overlong, sizeof overlong - 1, 1, "UTF-8");
  const char surrogate[] =
      "{\"\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_raw(surrogate, sizeof surrogate - 1, 1, "UTF-8");
  const char nul[] = "{\"a\0\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_raw(nul, sizeof nul - 1, 1, "not valid JSON");
  expect_fail("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
              "not valid JSON");
}

Test(reader, malformed_json_and_trailing_junk) {
  expect_fail("{\"a\":", 0, "not valid JSON");
  expect_fail("{} x", 0, "not valid JSON");
  expect_fail("{}{}", 0, "not valid JSON");
}

Test(reader, metadata_must_be_string_to_string) {
  expect_fail("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
  expect_fail("{\"__metadata__\":null}", 0, "__metadata__ is not an object");
  expect_fail("{\"__metadata__\":{\"n\":1}}", 0, "__metadata__ 'n' is not a string");
  expect_fail("{\"__metadata__\":{\"o\":{}}}", 0, "__metadata__ 'o' is not a string");
}

/* ------------------------------------------------------------------------ *
 * Tensor entries
 * ------------------------------------------------------------------------ */

Test(reader, tensor_fields_exact) {
  expect_fail("{\"w\":[]}", 0, "tensor 'w' is not an object");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}", 1,
              "tensor 'w': unexpected field 'foo'");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "tensor 'w': missing 'shape'");
  expect_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'w': missing 'dtype'");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "tensor 'w': missing 'data_offsets'");
}

Test(reader, unknown_dtype) {
  /* The dtype's own wording comes from sd_dtype_parse; the reader adds file and tensor. */
  const char *bad[] = {"X9", "f32", "F4", "F6_E2M3", "", "F32 "};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char js[256];
    snprintf(js, sizeof js, "{\"w\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,1]}}",
             bad[i]);
    expect_fail(js, 1, "t.safetensors: tensor 'w': ");
    if (bad[i][0]) expect_fail(js, 1, bad[i]);
  }
  expect_fail("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
              "tensor 'w': dtype is not a string");
}

Test(reader, shape_entries_must_be_non_negative_integers) {
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-3],\"data_offsets\":[0,1]}}", 1,
              "tensor 'w': shape[1] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,1]}}", 1,
              "tensor 'w': shape[0] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2,
              "tensor 'w': shape[0] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1e1],\"data_offsets\":[0,10]}}", 10,
              "tensor 'w': shape[0] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2,
              "tensor 'w': shape[0] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[null],\"data_offsets\":[0,2]}}", 2,
              "tensor 'w': shape[0] is not a non-negative integer");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":2,\"data_offsets\":[0,2]}}", 2,
              "tensor 'w': shape is not an array");
  /* Beyond int64: jansson refuses the number itself. */
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,2]}}",
              2, "not valid JSON");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
              "\"data_offsets\":[0,1]}}",
              1, "tensor 'w': shape has 17 dimensions, over 16");
}

Test(reader, byte_size_overflow) {
  /* 2^32 * 2^32 elements: the element count itself overflows. */
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
              0, "tensor 'w': U8[4294967296,4294967296] element count overflows");
  /* 2^62 elements fit, 2^62 * 8 bytes do not. */
  expect_fail("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}",
              0, "tensor 'w': F64[4611686018427387904] byte size overflows 64 bits");
}

Test(reader, size_must_match_shape) {
  sd_st_header h;
  sd_error err;
  const char *js = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}";
  cr_assert_eq(parse_raw(js, strlen(js), 10, &h, &err), SHARDD_E_FORMAT);
  cr_assert_str_eq(err.msg, "t.safetensors: tensor 'w': data_offsets [0,10] but F32[3] needs 12 "
                            "bytes");
  expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}", 0,
              "data_offsets [0,0] but F32[] needs 4 bytes");
}

Test(reader, data_offsets_shape) {
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
              "tensor 'w': data_offsets is not [begin, end]");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
              "tensor 'w': data_offsets is not [begin, end]");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
              "tensor 'w': data_offsets is not [begin, end]");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1,
              "tensor 'w': data_offsets is not [begin, end]");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":{}}}", 0,
              "tensor 'w': data_offsets is not [begin, end]");
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,1]}}", 2,
              "tensor 'w': data_offsets [2,1] end before begin");
}

/* ------------------------------------------------------------------------ *
 * Layout of the data section
 * ------------------------------------------------------------------------ */

Test(reader, offsets_must_start_at_zero) {
  expect_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8,
              "tensor 'w': data_offsets [4,8] do not start at 0 (hole of 4 bytes)");
}

Test(reader, hole_between_tensors) {
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
              12, "hole of 4 bytes between tensor 'a' (ends at 4) and tensor 'b' (starts at 8)");
}

Test(reader, overlapping_tensors) {
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
              8, "tensor 'b' data_offsets [4,8] overlap tensor 'a' [0,8]");
  /* Two tensors sharing the same bytes. */
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
              4, "overlap tensor 'a' [0,4]");
  /* A zero-size tensor pointing inside another one. */
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
              "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}",
              8, "tensor 'z' data_offsets [4,4] overlap tensor 'a' [0,8]");
}

Test(reader, trailing_bytes_and_short_data) {
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 5,
              "1 trailing byte after the last tensor (tensors end at 4, data section is 5 bytes)");
  expect_fail("{}", 3, "3 trailing bytes after the last tensor");
  expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3,
              "tensor 'a' data_offsets [0,4] run past the end of the file (data section is 3 "
              "bytes)");
}

/* ------------------------------------------------------------------------ *
 * Reading real files
 * ------------------------------------------------------------------------ */

static char tmpdir[64];

static void mk_tmp(void) {
  strcpy(tmpdir, "/tmp/shardd-test-reader-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

static void put_file(const char *path, const void *b, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, b, len), (ssize_t)len);
  close(fd);
}

Test(reader_file, reads_a_valid_file, .init = mk_tmp, .fini = rm_tmp) {
  const char *js = "{\"w\":{\"dtype\":\"I16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
  size_t len;
  unsigned char *b = mk(js, 8, &len);
  char path[128];
  snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
  put_file(path, b, len);
  sd_st_header h;
  sd_error err;
  cr_assert_eq(sd_st_read_file(path, &h, &err), 0, "%s", err.msg);
  cr_assert_eq(h.file_size, len);
  cr_assert_eq(h.ntensors, 1);
  cr_assert_eq(h.tensors[0].shape[1], 2);
  sd_st_header_free(&h);
  free(b);
}

Test(reader_file, truncated_files, .init = mk_tmp, .fini = rm_tmp) {
  const char *js = "{\"w\":{\"dtype\":\"I16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
  size_t len;
  unsigned char *b = mk(js, 8, &len);
  char path[128];
  snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
  sd_st_header h;
  sd_error err;
  /* Cut in the data, in the header, and in the length prefix. */
  size_t cuts[] = {len - 1, 8 + 10, 3};
  const char *frags[] = {"run past the end of the file (data section is 7 bytes)",
                         "runs past the end of the file (18 bytes)",
                         "file is 3 bytes, too short"};
  for (int i = 0; i < 3; i++) {
    put_file(path, b, cuts[i]);
    cr_assert_eq(sd_st_read_file(path, &h, &err), SHARDD_E_FORMAT);
    cr_assert_not_null(strstr(err.msg, frags[i]), "'%s' lacks '%s'", err.msg, frags[i]);
    cr_assert_not_null(strstr(err.msg, path), "'%s' lacks the path", err.msg);
  }
  free(b);
}

Test(reader_file, missing_and_not_regular, .init = mk_tmp, .fini = rm_tmp) {
  char path[128];
  snprintf(path, sizeof path, "%s/nope.safetensors", tmpdir);
  sd_st_header h;
  sd_error err;
  cr_assert_eq(sd_st_read_file(path, &h, &err), SHARDD_E_IO);
  cr_assert_not_null(strstr(err.msg, "cannot open: No such file or directory"), "%s", err.msg);
  cr_assert_eq(sd_st_read_file(tmpdir, &h, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, "not a regular file"), "%s", err.msg);
}

Test(reader, hostile_names_stay_readable_in_messages) {
  /* A 5000-byte name with a control character must not push the facts out
   * of the message nor put raw control bytes into it. */
  size_t nl = 5000;
  char *js = malloc(nl + 200);
  size_t k = (size_t)sprintf(js, "{\"x\\n");
  memset(js + k, 'a', nl);
  k += nl;
  k += (size_t)sprintf(js + k, "\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}");
  sd_st_header h;
  sd_error err;
  cr_assert_eq(parse_raw(js, k, 10, &h, &err), SHARDD_E_FORMAT);
  cr_assert_not_null(strstr(err.msg, "tensor 'x?aaaa"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "...': data_offsets [0,10] but F32[3] needs 12 bytes"), "%s",
                     err.msg);
  cr_assert_null(strchr(err.msg, '\n'));
  free(js);
}

/* ------------------------------------------------------------------------ *
 * Scale: a header near the format's 100 MB limit is checked in one pass, in
 * memory linear in its tensors (README: the header's bytes, then at most
 * 256 bytes a tensor), never a JSON tree's worth
 * ------------------------------------------------------------------------ */
#include <sys/resource.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SCALE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SCALE_SANITIZED 1
#endif
#endif

static long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

Test(reader, a_hundred_megabyte_header_of_zero_size_tensors, .timeout = 120) {
#ifdef SCALE_SANITIZED
  const size_t n = 100000; /* the bound is not the sanitizer's to keep */
#else
  const size_t n = 1650000;
#endif
  const size_t entry = 60; /* ,"t0000000":{"dtype":"F32","shape":[0],"data_offsets":[0,0]} */
  size_t cap = 64 + n * entry, k = 8;
  unsigned char *b = malloc(cap);
  cr_assert_not_null(b);
  k += (size_t)snprintf((char *)b + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (size_t i = 0; i < n; i++)
    k += (size_t)snprintf((char *)b + k, cap - k, ",\"t%07zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i);
  b[k++] = '}';
  while ((k - 8) % 8) b[k++] = ' ';
  uint64_t hl = k - 8;
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
  cr_assert_leq(hl, 100000000u, "the test's header is over the format's limit");
  memset(b + k, 0, cap - k); /* the pages the parse will not touch, counted before it starts */
  long before = maxrss_kib();
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sd_st_header h;
  sd_error err;
  int rc = sd_st_parse("big.safetensors", b, k, k, &h, &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long grew = maxrss_kib() - before;
  cr_assert_eq(rc, 0, "%s", err.msg);
  cr_assert_eq(h.ntensors, n);
  cr_assert_eq(h.nmeta, 1);
  printf("a %llu-byte header of %zu tensors: %.2f s, %ld MiB more resident (%.0f bytes a tensor)\n",
         (unsigned long long)hl, n, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
         grew / 1024, (double)grew * 1024 / (double)n);
#ifndef SCALE_SANITIZED
  cr_assert_leq((double)grew * 1024, 256.0 * (double)n, "%ld KiB for %zu tensors: over 256 bytes a tensor", grew, n);
#endif
  sd_st_header_free(&h);
  free(b);
}
