/* The scan of a puts line (proto/puts_scan.c): what it takes it reads as jansson and the field getters do; the rest it leaves to them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_msg.h"
#include "sd_puts_scan.h"
#include "sd_request.h"

/* Asserts the scan took line, and that each slice is what the JSON reading makes of it. */
static void same_as_json(const char *line, size_t want_n) {
  sd_puts_scan p;
  cr_assert_eq(sd_puts_scan_line(line, strlen(line), &p), 1, "not scanned: %s", line);
  json_t *req = NULL;
  sd_error err = {0};
  cr_assert_eq(sd_msg_parse(line, strlen(line), &req, &err), 0, "%s", err.msg);
  const json_t *slices = NULL;
  size_t n = 0;
  cr_assert_eq(sd_req_puts_slices(req, &slices, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(p.n, n);
  cr_assert_eq(n, want_n);
  cr_assert_eq(p.id, json_integer_value(json_object_get(req, "id")));
  cr_assert_str_eq(p.save, json_string_value(json_object_get(req, "save")));
  for (size_t k = 0; k < n; k++) {
    const json_t *o = json_array_get(slices, k);
    sd_req_tensor t;
    sd_req_source src;
    cr_assert_eq(sd_req_tensor_parse(o, SD_NAME_MAX, SD_MAX_DIMS, &t, &err), 0, "slice %zu: %s", k, err.msg);
    cr_assert_eq(sd_req_source_parse(o, t.name, t.len, &src, &err), 0, "slice %zu: %s", k, err.msg);
    const sd_puts_slice *s = &p.slices[k];
    cr_assert_str_eq(s->t.name, t.name);
    cr_assert_eq(s->name_len, strlen(t.name));
    cr_assert_eq(s->t.dtype, t.dtype);
    cr_assert_eq(s->t.ndim, t.ndim);
    for (uint32_t d = 0; d < t.ndim; d++) {
      cr_assert_eq(s->t.shape[d], t.shape[d], "slice %zu dim %u", k, d);
      cr_assert_eq(s->t.start[d], t.start[d], "slice %zu dim %u", k, d);
      cr_assert_eq(s->t.count[d], t.count[d], "slice %zu dim %u", k, d);
    }
    cr_assert_eq(s->t.index, t.index);
    cr_assert_eq(!s->t.prefix, !t.prefix);
    if (t.prefix) cr_assert_str_eq(s->t.prefix, t.prefix);
    cr_assert_eq(s->t.len, t.len);
    cr_assert_eq(s->src.has_region, src.has_region);
    cr_assert_eq(s->src.region, src.region);
    cr_assert_eq(s->src.offset, src.offset);
    cr_assert_eq(s->src.deferred, src.deferred);
    cr_assert_null(s->src.data);
  }
  json_decref(req);
  sd_puts_scan_free(&p);
}

static void left_to_json(const char *line) {
  sd_puts_scan p;
  cr_assert_eq(sd_puts_scan_line(line, strlen(line), &p), 0, "scanned: %s", line);
  cr_assert_eq(p.n, 0);
  cr_assert_null(p.slices);
  cr_assert_null(p.pool);
}

#define HEAD "{\"op\":\"puts\",\"id\":7,\"save\":\"s-1\",\"slices\":["
#define A "{\"name\":\"model.layers.0.mlp.experts.3.gate_proj.weight\",\"dtype\":\"BF16\",\"shape\":[80,128],\"index\":12,\"region\":1,\"offset\":4096}"

Test(puts_scan, libshardd_lines_read_as_json_reads_them) {
  same_as_json(HEAD A "]}", 1);
  same_as_json(HEAD A ","
                    "{\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4,6],\"start\":[2,0],\"count\":[2,6],\"region\":2,"
                    "\"offset\":0,\"deferred\":true},"
                    "{\"name\":\"c\",\"dtype\":\"U8\",\"shape\":[],\"prefix\":\"optimizer\",\"region\":1,\"offset\":"
                    "999999999999999,\"deferred\":false},"
                    "{\"name\":\"empty\",\"dtype\":\"F16\",\"shape\":[0,5]},"
                    "{\"name\":\"e\",\"dtype\":\"I64\",\"shape\":[3],\"start\":[3],\"count\":[0],\"deferred\":true}]}",
               5);
  same_as_json(HEAD "]}", 0);
  /* JSON's white space anywhere but in the head, and the fields in any order */
  same_as_json("{\"op\":\"puts\" , \"slices\" : [ { \"offset\" : 0 , \"region\" : 1 , \"shape\" : [ 2 ] , "
               "\"dtype\" : \"U8\" , \"name\" : \"x y\" } ] ,\t\"save\":\"s\",\r\n\"id\":0 }  ",
               1);
}

Test(puts_scan, every_other_line_is_left_to_json) {
  const char *lines[] = {
      "{\"op\":\"put\",\"id\":1,\"save\":\"s\"}",
      "{\"id\":7,\"op\":\"puts\",\"save\":\"s\",\"slices\":[]}", /* op not first */
      "{ \"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"save\":\"s\",\"slices\":[]}",            /* no id */
      "{\"op\":\"puts\",\"id\":\"x\",\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":7,\"slices\":[]}",                  /* no save */
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\"}",                 /* no slices */
      "{\"op\":\"puts\",\"id\":7,\"save\":null,\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":7,\"id\":8,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[],\"extra\":1}",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[]}x",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[]",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":{}}",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[1]}",
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\",\"slices\":[" A ",]}",
      "{\"op\":\"puts\",\"id\":-7,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":7.0,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":7e0,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":07,\"save\":\"s\",\"slices\":[]}",
      "{\"op\":\"puts\",\"id\":1234567890123456,\"save\":\"s\",\"slices\":[]}", /* 16 digits */
      "{\"op\":\"puts\",\"id\":7,\"save\":\"s\\u0031\",\"slices\":[]}",
      /* slices the scan leaves to the JSON reading, which reads or refuses them */
      HEAD "{\"name\":\"a\\\"b\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"caf\xc3\xa9\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}]}",
      HEAD "{\"name\":\"a\",\"name\":\"b\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0,\"rank\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0,\"index\":null}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0,\"deferred\":1}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1.5],\"region\":1,\"offset\":0}]}",
      HEAD "{\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",                      /* no name */
      HEAD "{\"name\":\"a\",\"shape\":[1],\"region\":1,\"offset\":0}]}",                        /* no dtype */
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"region\":1,\"offset\":0}]}",                     /* no shape */
      HEAD "{\"name\":\"\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"__metadata__\",\"dtype\":\"U8\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"X99\",\"shape\":[1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[0],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[0,0],\"count\":[4,1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[3],\"count\":[2],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4],\"region\":1}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4],\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[4]}]}",                                    /* bytes, no source */
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[0],\"region\":1}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"prefix\":\"a/b\",\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"region\":1,\"offset\":0}]}",
      HEAD "{\"name\":\"a\",\"dtype\":\"F64\",\"shape\":[999999999999999,999999999999999],\"region\":1,\"offset\":0}]}",
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) left_to_json(lines[i]);
}

/* A puts line of n empty slices (malloc'd). */
static char *empty_slices(size_t n) {
  const char *one = "{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[0]}";
  char *line = malloc(strlen(HEAD) + n * (strlen(one) + 1) + 3), *o = line;
  o += sprintf(o, "%s", HEAD);
  for (size_t i = 0; i < n; i++) o += sprintf(o, "%s%s", i ? "," : "", one);
  sprintf(o, "]}");
  return line;
}

Test(puts_scan, at_most_the_slices_a_request_may_hold) {
  char *line = empty_slices(SD_PUTS_MAX);
  sd_puts_scan p;
  cr_assert_eq(sd_puts_scan_line(line, strlen(line), &p), 1);
  cr_assert_eq(p.n, SD_PUTS_MAX);
  sd_puts_scan_free(&p);
  free(line);
  line = empty_slices(SD_PUTS_MAX + 1);
  left_to_json(line);
  free(line);
}

Test(puts_scan, a_scan_keeps_the_line_it_takes_over) {
  const char *text = HEAD A "]}";
  char *line = strdup(text);
  sd_puts_scan p;
  cr_assert_eq(sd_puts_scan_line(line, strlen(line), &p), 1);
  sd_puts_scan_take(&p, line, strlen(line));
  cr_assert_eq(p.len, strlen(text));
  cr_assert_eq(memcmp(p.line, text, p.len), 0, "the line is read, not changed");
  sd_puts_scan_free(&p);
  cr_assert_null(p.line);
}
