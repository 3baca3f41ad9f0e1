/* The puts request (many slices in one line): bytes read back, refusals naming the slice and its tensor, partly bad lines, its limits, mixed with put. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shardd/shardd.h"
#include "xclient.h"

TestSuite(puts, .init = x_init, .fini = x_fini, .timeout = 120);

/* A slice of one U8 element, inline. */
#define ONE(name, b64) "{\"name\":\"" name "\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"" b64 "\"}"

static void begin(x_conn *c, const char *save, const char *dir) {
  x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1}", save, dir),
       "begin");
}

/* Asserts r is a puts refusal with this code, a message holding every frag given, and `accepted` slices taken. */
static void refused(json_t *r, const char *code, const char *frag1, const char *frag2, long accepted) {
  const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
  json_int_t got = json_integer_value(json_object_get(r, "accepted"));
  cr_assert(msg && (!frag2 || strstr(msg, frag2)), "message '%s' lacks '%s'", msg ? msg : "(none)", frag2);
  cr_assert_eq(got, accepted, "accepted %lld, want %ld (%s)", (long long)got, accepted, msg ? msg : "");
  x_err(r, code, frag1, "puts");
}

static json_t *commit(x_conn *c, const char *save) {
  x_ok(x_callf(c, "{\"op\":\"seal\",\"save\":\"%s\"}", save), "seal");
  json_t *w = x_callf(c, "{\"op\":\"wait\",\"save\":\"%s\"}", save);
  cr_assert(json_is_true(json_object_get(w, "ok")), "the save did not commit");
  return w;
}

/* ------------------------------------------------------------------------ */
Test(puts, slices_from_a_region_and_inline_read_back_beside_single_puts) {
  x_start(NULL);
  x_conn *c = x_connect();
  uint8_t *map = NULL;
  char shm[64];
  snprintf(shm, sizeof shm, "/shardd-puts-%d", (int)getpid());
  int fd = x_shm_create(shm, 4096, 3, &map);
  json_t *r = x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", shm);
  json_int_t region = json_integer_value(json_object_get(r, "region"));
  x_ok(r, "attach");
  begin(c, "mix", "mix");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"mix\",\"name\":\"single\",\"dtype\":\"U8\",\"shape\":[2],\"data\":\"AQI=\","
                 "\"index\":0}"),
       "a put before");
  r = x_callf(c,
              "{\"op\":\"puts\",\"save\":\"mix\",\"slices\":["
              "{\"name\":\"whole\",\"dtype\":\"U8\",\"shape\":[16],\"region\":%lld,\"offset\":100,\"index\":1},"
              "{\"name\":\"rows\",\"dtype\":\"U8\",\"shape\":[2,4],\"start\":[0,0],\"count\":[1,4],\"region\":%lld,"
              "\"offset\":200,\"index\":2},"
              "{\"name\":\"inline\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"Bw==\",\"index\":3},"
              "{\"name\":\"empty\",\"dtype\":\"F32\",\"shape\":[0,5],\"index\":4}]}",
              (long long)region, (long long)region);
  cr_assert_eq(json_integer_value(json_object_get(r, "accepted")), 4);
  cr_assert_eq(json_integer_value(json_object_get(r, "bytes")), 16 + 4 + 1);
  x_ok(r, "puts");
  /* the other row of `rows` as a single put, after the line that began the tensor */
  x_ok(x_callf(c, "{\"op\":\"put\",\"save\":\"mix\",\"name\":\"rows\",\"dtype\":\"U8\",\"shape\":[2,4],\"start\":[1,0],"
                  "\"count\":[1,4],\"region\":%lld,\"offset\":300}",
               (long long)region),
       "a put after");
  json_t *w = commit(c, "mix");
  cr_assert_eq(json_integer_value(json_object_get(w, "tensors")), 5);
  json_decref(w);
  const uint8_t single[2] = {1, 2}, seven = 7;
  h_check_bytes("mix", "single", single, 2);
  h_check_bytes("mix", "whole", map + 100, 16);
  uint8_t rows[8];
  memcpy(rows, map + 200, 4);
  memcpy(rows + 4, map + 300, 4);
  h_check_bytes("mix", "rows", rows, 8);
  h_check_bytes("mix", "inline", &seven, 1);
  munmap(map, 4096);
  close(fd);
  shm_unlink(shm);
  x_close(c);
  x_serving();
}

Test(puts, a_malformed_slice_stops_the_line_and_names_itself_and_its_tensor) {
  x_start(NULL);
  x_conn *c = x_connect();
  begin(c, "bad", "bad");
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"bad\",\"slices\":["
                    ONE("a", "AQ==") ","
                    ONE("b", "Ag==") ","
                    "{\"name\":\"c\",\"dtype\":\"X99\",\"shape\":[1],\"data\":\"Aw==\"},"
                    "{\"name\":\"d\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"BA==\"}]}"),
          "invalid_argument", "slices[2]", "tensor 'c'", 2);
  /* the bytes do not fit the box: the tensor named once */
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"bad\",\"slices\":["
                    "{\"name\":\"e\",\"dtype\":\"U8\",\"shape\":[3],\"data\":\"AQ==\"}]}"),
          "invalid_argument", "slices[0]: tensor 'e': 'data' holds 1 bytes", NULL, 0);
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"bad\",\"slices\":[{\"name\":\"f\",\"dtype\":\"U8\",\"shape\":[4],"
                    "\"region\":9,\"offset\":0}]}"),
          "no_such_region", "slices[0]: tensor 'f'", NULL, 0);
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"bad\",\"slices\":[{\"name\":\"__metadata__\",\"dtype\":\"U8\","
                    "\"shape\":[1],\"data\":\"AQ==\"}]}"),
          "invalid_argument", "slices[0]", "__metadata__", 0);
  /* the save goes on with what was accepted, and a later line is taken whole */
  json_t *r = x_call(c, "{\"op\":\"puts\",\"save\":\"bad\",\"slices\":["
                        "{\"name\":\"d\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"BA==\"}]}");
  cr_assert_eq(json_integer_value(json_object_get(r, "accepted")), 1);
  x_ok(r, "a good line after the bad ones");
  json_t *w = commit(c, "bad");
  cr_assert_eq(json_integer_value(json_object_get(w, "tensors")), 3);
  json_decref(w);
  const uint8_t two = 2, four = 4;
  h_check_bytes("bad", "b", &two, 1);
  h_check_bytes("bad", "d", &four, 1);
  x_close(c);
  x_serving();
}

Test(puts, the_save_refusing_a_slice_keeps_those_before_it) {
  const char *flags[] = {"--max-tensors", "3", NULL};
  x_start(flags);
  x_conn *c = x_connect();
  begin(c, "lim", "lim");
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"lim\",\"slices\":["
                    ONE("t0", "AQ==") ","
                    ONE("t1", "AQ==") ","
                    ONE("t1", "AQ==") ","
                    ONE("t2", "AQ==") ","
                    ONE("t3", "AQ==") ","
                    "{\"name\":\"t4\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}]}"),
          "limit_exceeded", "max_tensors=3", "slices[4]: tensor 't3': save 'lim'", 4);
  json_t *w = commit(c, "lim");
  cr_assert_eq(json_integer_value(json_object_get(w, "tensors")), 3);
  json_decref(w);

  /* a mismatch fails the save, naming the slice and its tensor */
  begin(c, "mm", "mm");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"mm\",\"name\":\"w\",\"dtype\":\"F32\",\"shape\":[1],\"data\":\"AACAPw==\"}"),
       "put");
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"mm\",\"slices\":["
                    ONE("v", "AQ==") ","
                    "{\"name\":\"w\",\"dtype\":\"BF16\",\"shape\":[1],\"data\":\"gD8=\"},"
                    "{\"name\":\"u\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}]}"),
          "mismatch", "slices[1]: tensor 'w'", NULL, 1);
  json_t *r = x_call(c, "{\"op\":\"wait\",\"save\":\"mm\"}");
  x_err(r, "mismatch", "tensor 'w'", "the failed save's wait");
  char p[4096];
  cr_assert_eq(x_tree_hash(h_path(p, sizeof p, "mm")), 0, "the failed save left its folder");
  x_close(c);
  x_serving();
}

Test(puts, the_line_itself_is_checked_and_bounded) {
  x_start(NULL);
  x_conn *c = x_connect();
  /* hello says how big a client may make its lines */
  json_t *h = x_call(c, "{\"op\":\"hello\",\"proto\":1}");
  cr_assert_eq(json_integer_value(json_object_get(h, "max_puts")), 16384);
  cr_assert_eq(json_integer_value(json_object_get(h, "max_line")), 16777216);
  json_decref(h);
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"nobody\",\"slices\":[]}"), "no_such_save", "nobody", NULL, 0);
  begin(c, "ln", "ln");
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"ln\"}"), "invalid_argument", "'slices' is required", NULL, 0);
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"ln\",\"slices\":{}}"), "invalid_argument", "must be an array", NULL, 0);
  refused(x_call(c, "{\"op\":\"puts\",\"save\":\"ln\",\"slices\":[{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],"
                    "\"data\":\"AQ==\"},7]}"),
          "invalid_argument", "slices[1] must be an object", NULL, 0);
  /* one slice over the bound: refused before any is read */
  size_t one = strlen("{},"), cap = 64 + 16385 * one;
  char *line = malloc(cap), *o = line;
  o += sprintf(o, "{\"op\":\"puts\",\"save\":\"ln\",\"slices\":[");
  for (int i = 0; i < 16385; i++) o += sprintf(o, i ? ",{}" : "{}");
  sprintf(o, "]}");
  refused(x_call(c, line), "limit_exceeded", "16385 slices", "16384", 0);
  free(line);
  /* an empty line puts nothing */
  json_t *r = x_call(c, "{\"op\":\"puts\",\"save\":\"ln\",\"slices\":[]}");
  cr_assert_eq(json_integer_value(json_object_get(r, "accepted")), 0);
  x_ok(r, "no slices");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"ln\",\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}"),
       "put");
  json_decref(commit(c, "ln"));
  x_close(c);
  x_serving();
}

/* libshardd sizes its puts lines by the daemon's max_line: a small one costs it more lines, never the connection. */
Test(puts, put_many_fits_its_lines_to_a_small_max_line) {
  const char *flags[] = {"--max-line", "2048", NULL};
  x_start(flags);
  enum { N = 700 };
  shardd_client *c = NULL;
  shardd_arena *a = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(shardd_arena_create(c, N * 4, &a), 0, "%s", shardd_last_error(c));
  shardd_save_opts o = {.save = "small", .dir = "small", .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  static char names[N][64];
  static shardd_tensor_desc d[N];
  static uint64_t offs[N];
  static const uint64_t shape[1] = {4};
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.experts.%d.down_proj.weight", i / 64, i % 64);
    d[i] = (shardd_tensor_desc){.name = names[i], .dtype = "U8", .ndim = 1, .shape = shape, .index = i};
    offs[i] = (uint64_t)i * 4;
    memset((char *)shardd_arena_data(a) + offs[i], i & 0xff, 4);
  }
  size_t at = 99;
  cr_assert_eq(shardd_put_many(c, "small", d, offs, N, a, 0, &at), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, "small"), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, "small", X_REPLY_MS, &res), 0, "%s", shardd_last_error(c));
  cr_assert_eq(res.tensors, N);
  for (int i = 0; i < N; i += 97) {
    uint8_t want[4];
    memset(want, i & 0xff, 4);
    h_check_bytes("small", names[i], want, 4);
  }
  cr_assert_eq(x_log_count("max_line"), 0, "a line was over max_line");
  shardd_arena_destroy(a);
  shardd_close(c);
  x_serving();
}

/* The reply's text with every "from" replaced by "to" (malloc'd). */
static char *dump_as(json_t *r, const char *from, const char *to) {
  char *d = json_dumps(r, JSON_SORT_KEYS | JSON_COMPACT), *p;
  cr_assert(d && strlen(from) == strlen(to));
  while ((p = strstr(d, from))) memcpy(p, to, strlen(to));
  json_decref(r);
  return d;
}

/* A puts line of libshardd's shape is read by a scan, not as JSON (proto/puts_scan.c); the same
 * line with a space after its brace is read as JSON. Both get the same answers, line by line. */
Test(puts, a_scanned_line_is_answered_as_one_read_as_json) {
  static const char *lines[] = {
      "{\"name\":\"z\",\"dtype\":\"F32\",\"shape\":[0,4],\"index\":3},"
      "{\"name\":\"y\",\"dtype\":\"U8\",\"shape\":[2],\"start\":[0],\"count\":[0],\"deferred\":true}",
      "{\"name\":\"x\",\"dtype\":\"U8\",\"shape\":[0]},{\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[4],\"region\":9,"
      "\"offset\":0}",
      "{\"name\":\"v\",\"dtype\":\"U8\",\"shape\":[0]},{\"name\":\"u\",\"dtype\":\"X9\",\"shape\":[0]}",
      "{\"name\":\"t\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[3],\"count\":[2],\"region\":1,\"offset\":0}",
      "{\"name\":\"s\",\"dtype\":\"U8\",\"shape\":[0]},{\"name\":\"z\",\"dtype\":\"F16\",\"shape\":[0,4]}",
      "{\"name\":\"r\",\"dtype\":\"U8\",\"shape\":[0]}",
  };
  x_start(NULL);
  x_conn *scanned = x_connect(), *read = x_connect();
  begin(scanned, "scan", "scan");
  begin(read, "json", "json");
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    char *a = dump_as(x_callf(scanned, "{\"op\":\"puts\",\"id\":%zu,\"save\":\"scan\",\"slices\":[%s]}", i, lines[i]),
                      "scan", "scan");
    char *b = dump_as(x_callf(read, "{ \"op\":\"puts\",\"id\":%zu,\"save\":\"json\",\"slices\":[%s]}", i, lines[i]),
                      "json", "scan");
    cr_assert_str_eq(a, b, "line %zu", i);
    free(a);
    free(b);
  }
  x_close(scanned);
  x_close(read);
  x_serving();
}
