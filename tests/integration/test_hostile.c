/* Hostile clients: malformed, mistyped and out-of-range requests, bad UTF-8, stalls, connection churn, puts past a segment; the daemon keeps serving. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xclient.h"

static void start_default(void) {
  x_init();
  x_start(NULL);
}

TestSuite(hostile, .init = start_default, .fini = x_fini, .timeout = 180);

/* One hostile line and the code its single reply must carry ("ok" for success). */
typedef struct {
  const char *line;
  const char *code;
  const char *frag;        /* the message names this (field, limit, ...) */
} hline;

/* Sends every line on c, each answered on its own, then checks the daemon
 * still answers status on the same connection. */
static void run_lines(x_conn *c, const hline *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    x_send(c, v[i].line, strlen(v[i].line));
    x_send(c, "\n", 1);
    json_t *r = x_reply(c);
    char what[256];
    snprintf(what, sizeof what, "line %zu '%.120s'", i, v[i].line);
    if (!strcmp(v[i].code, "ok"))
      x_ok(r, what);
    else
      x_err(r, v[i].code, v[i].frag, what);
  }
  x_status_ok(c, -1);
}

/* ------------------------------------------------------------------------ */
Test(hostile, malformed_json_and_wrong_types) {
  static const hline lines[] = {
      {"this is not JSON", "bad_request", "invalid JSON"},
      {"", "bad_request", NULL},
      {"{", "bad_request", NULL},
      {"{\"op\":\"status\"", "bad_request", NULL},
      {"{\"op\":\"status\"}{\"op\":\"status\"}", "bad_request", NULL},
      {"[]", "bad_request", NULL},
      {"\"status\"", "bad_request", NULL},
      {"42", "bad_request", NULL},
      {"null", "bad_request", NULL},
      {"{\"op\":1}", "bad_request", "op"},
      {"{\"op\":null}", "bad_request", "op"},
      {"{\"op\":[\"status\"]}", "bad_request", "op"},
      {"{\"id\":7}", "bad_request", "op"},
      {"{\"op\":\"frobnicate\"}", "unknown_op", "frobnicate"},
      {"{\"op\":\"status\",\"id\":{\"deep\":[1,2,{\"x\":null}]}}", "ok", NULL},
      {"{\"op\":\"hello\",\"proto\":\"1\"}", "invalid_argument", "proto"},
      {"{\"op\":\"hello\",\"proto\":2}", "unsupported_proto", NULL},
      {"{\"op\":\"begin\",\"save\":5,\"dir\":\"d\",\"rank\":0,\"world_size\":1}", "invalid_argument", "save"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":[\"a\"],\"rank\":0,\"world_size\":1}", "invalid_argument", "dir"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":true,\"world_size\":1}", "invalid_argument", "rank"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":0}", "invalid_argument", "world_size"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"overwrite\":\"yes\"}",
       "invalid_argument", "overwrite"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"metadata\":{\"a\":1}}",
       "invalid_argument", "metadata"},
      {"{\"op\":\"begin\",\"save\":\"s\",\"dir\":\"d\",\"rank\":0,\"world_size\":1,\"metadata\":[\"a\"]}",
       "invalid_argument", "metadata"},
      {"{\"op\":\"wait\",\"save\":{}}", "invalid_argument", "save"},
      {"{\"op\":\"detach\",\"region\":\"1\"}", "invalid_argument", "region"},
      {"{\"op\":\"attach\",\"shm\":17}", "invalid_argument", "shm"},
      /* nesting deeper than the parser allows is refused, not recursed into */
      {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
       "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
       "bad_request", NULL},
  };
  x_conn *c = x_connect();
  run_lines(c, lines, sizeof lines / sizeof lines[0]);
  /* 100,000 levels of nesting in one line */
  char *deep = malloc(200001);
  memset(deep, '[', 100000);
  memset(deep + 100000, ']', 100000);
  deep[200000] = 0;
  x_err(x_call(c, deep), "bad_request", "depth", "100000-deep nesting");
  free(deep);
  x_status_ok(c, 0);
  x_close(c);
  x_serving();
}

Test(hostile, numbers_negative_huge_fractional_and_duplicate_keys) {
  x_conn *c = x_connect();
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"num\",\"dir\":\"num/a\",\"rank\":0,\"world_size\":1}"), "begin");
  static const hline lines[] = {
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":-1,\"world_size\":1}", "invalid_argument", "rank"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":1.5}", "invalid_argument",
       "world_size"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":1e300}", "invalid_argument",
       "world_size"},
      /* past what the parser holds at all: the line is refused */
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":18446744073709551616}",
       "bad_request", "too big"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":9223372036854775807}",
       "invalid_argument", "world_size"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":9007199254740993}",
       "invalid_argument", "world_size"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":0}", "invalid_argument",
       "world_size"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":5,\"world_size\":2}", "invalid_argument", "rank"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":1,\"max_shard_size\":0}",
       "invalid_argument", "max_shard_size"},
      {"{\"op\":\"begin\",\"save\":\"n2\",\"dir\":\"n/2\",\"rank\":0,\"world_size\":1,\"max_shard_size\":-5}",
       "invalid_argument", "max_shard_size"},
      {"{\"op\":\"status\",\"id\":1e400}", "bad_request", "overflow"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[-1],\"data\":\"AQ==\"}",
       "invalid_argument", "shape"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1.5],\"data\":\"AQ==\"}",
       "invalid_argument", "shape"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1e20],\"data\":\"AQ==\"}",
       "invalid_argument", "shape"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1,\"2\"],\"data\":\"AQ==\"}",
       "invalid_argument", "shape"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":\"[1]\",\"data\":\"AQ==\"}",
       "invalid_argument", "shape"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,"
       "4294967296],\"start\":[0,0,0],\"count\":[1,1,1],\"data\":\"AQ==\"}",
       "invalid_argument", "w"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"F64\",\"shape\":[9007199254740992],"
       "\"start\":[0],\"count\":[9007199254740992],\"data\":\"AQ==\"}",
       "invalid_argument", "w"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[3],\"count\":[2],"
       "\"data\":\"AQI=\"}",
       "invalid_argument", "w"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[4],\"start\":[0],"
       "\"data\":\"AQ==\"}",
       "invalid_argument", "count"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"!!!!\"}",
       "invalid_argument", "data"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"index\":-3,\"data\":\"AQ==\"}",
       "invalid_argument", "index"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"F4\",\"shape\":[2],\"data\":\"AQ==\"}",
       "invalid_argument", "F4"},
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\","
       "\"region\":1,\"offset\":0}",
       "invalid_argument", "w"},
      /* duplicate keys, at the top and nested */
      {"{\"op\":\"status\",\"op\":\"hello\"}", "bad_request", "duplicate"},
      {"{\"op\":\"begin\",\"save\":\"n3\",\"dir\":\"n/3\",\"rank\":0,\"world_size\":1,"
       "\"metadata\":{\"a\":\"1\",\"a\":\"2\"}}",
       "bad_request", "duplicate"},
      /* integral numbers written as reals are fine */
      {"{\"op\":\"put\",\"save\":\"num\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2.0],\"start\":[0],"
       "\"count\":[2e0],\"data\":\"AQI=\"}",
       "ok", NULL},
  };
  run_lines(c, lines, sizeof lines / sizeof lines[0]);
  /* the save these requests aimed at is unharmed */
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"num\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"num\"}"), "wait");
  const uint8_t want[2] = {1, 2};
  h_check_bytes("num/a", "w", want, 2);
  x_close(c);
  x_serving();
}

Test(hostile, invalid_utf8_and_control_characters) {
  x_conn *c = x_connect();
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"u8\",\"dir\":\"u8/a\",\"rank\":0,\"world_size\":1}"), "begin");
  static const hline lines[] = {
      /* raw bytes that are not UTF-8: the whole line is refused */
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"\xff\xfe\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"a\xc0\x80\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"a\xed\xa0\x80\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"\xe2\x82\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"status\",\"id\":\"\x80\"}", "bad_request", NULL},
      /* escapes that decode to what a name must not hold */
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"a\\ud800\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"a\\u0000b\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "bad_request", NULL},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"a\\u0001b\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "invalid_argument", "control"},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"line\\nbreak\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "invalid_argument", "control"},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"del\\u007f\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "invalid_argument", "control"},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"__metadata__\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "invalid_argument", "__metadata__"},
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
       "invalid_argument", "empty"},
      {"{\"op\":\"begin\",\"save\":\"c1\",\"dir\":\"u8/esc\\u001b[2J\",\"rank\":0,\"world_size\":1}", "bad_path",
       "control"},
      {"{\"op\":\"begin\",\"save\":\"c1\",\"dir\":\"u8/a\\rb\",\"rank\":0,\"world_size\":1}", "bad_path", "control"},
      {"{\"op\":\"begin\",\"save\":\"c\\u0001\",\"dir\":\"u8/c\",\"rank\":0,\"world_size\":1}", "invalid_argument",
       "save"},
      {"{\"op\":\"begin\",\"save\":\"c2\",\"dir\":\"u8/c\",\"rank\":0,\"world_size\":1,\"prefix\":\"m\\tx\"}",
       "invalid_argument", "prefix"},
      {"{\"op\":\"begin\",\"save\":\"c3\",\"dir\":\"u8/.shardd-tmp-x\",\"rank\":0,\"world_size\":1}", "bad_path",
       "reserved"},
      {"{\"op\":\"file\",\"save\":\"u8\",\"path\":\"con\\u007ffig.json\",\"data\":\"e30=\"}", "bad_path", "control"},
      {"{\"op\":\"file\",\"save\":\"u8\",\"path\":\"../config.json\",\"data\":\"e30=\"}", "bad_path", NULL},
      {"{\"op\":\"attach\",\"shm\":\"/../../etc/passwd\"}", "invalid_argument", "shm"},
      {"{\"op\":\"attach\",\"shm\":\"noslash\"}", "invalid_argument", "shm"},
      {"{\"op\":\"attach\",\"shm\":\"/\"}", "invalid_argument", "shm"},
      /* valid UTF-8 beyond ASCII is a fine tensor name */
      {"{\"op\":\"put\",\"save\":\"u8\",\"name\":\"w\xc3\xa9ight.\xf0\x9f\x99\x82\",\"dtype\":\"U8\",\"shape\":[1],"
       "\"data\":\"Bw==\"}",
       "ok", NULL},
  };
  run_lines(c, lines, sizeof lines / sizeof lines[0]);
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"u8\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"u8\"}"), "wait");
  const uint8_t seven = 7;
  h_check_bytes("u8/a", "w\xc3\xa9ight.\xf0\x9f\x99\x82", &seven, 1);
  x_close(c);
  x_serving();
}

Test(hostile, puts_whose_region_and_offset_point_past_the_segment) {
  char name[64];
  snprintf(name, sizeof name, "/sdxt-past-%d", (int)getpid());
  int fd = x_shm_create(name, 4096, 3, NULL);
  x_conn *c = x_connect(), *other = x_connect();
  json_t *r = x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name);
  cr_assert_eq(json_integer_value(json_object_get(r, "region")), 1);
  cr_assert_eq(json_integer_value(json_object_get(r, "size")), 4096);
  json_decref(r);
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"past\",\"dir\":\"past/a\",\"rank\":0,\"world_size\":1}"), "begin");
  x_ok(x_call(other, "{\"op\":\"begin\",\"save\":\"past2\",\"dir\":\"past/b\",\"rank\":0,\"world_size\":1}"),
       "begin on the other connection");
#define PUT(extra) "{\"op\":\"put\",\"save\":\"past\",\"name\":\"w\",\"dtype\":\"F32\"," extra "}"
  static const hline lines[] = {
      {PUT("\"shape\":[1],\"region\":1,\"offset\":4096"), "out_of_range", "region 1"},
      {PUT("\"shape\":[1],\"region\":1,\"offset\":4093"), "out_of_range", "4097"},
      {PUT("\"shape\":[1025],\"region\":1,\"offset\":0"), "out_of_range", "4096 bytes"},
      {PUT("\"shape\":[1],\"region\":1,\"offset\":9007199254740992"), "out_of_range", NULL},
      {PUT("\"shape\":[1],\"region\":1,\"offset\":18446744073709551615"), "bad_request", "too big"},
      {PUT("\"shape\":[1],\"region\":1,\"offset\":9007199254740993"), "invalid_argument", "offset"},
      {PUT("\"shape\":[1],\"region\":1,\"offset\":-4"), "invalid_argument", "offset"},
      {PUT("\"shape\":[2305843009213693952],\"start\":[0],\"count\":[2305843009213693952],\"region\":1,\"offset\":0"),
       "invalid_argument", NULL},
      {PUT("\"shape\":[1],\"region\":2,\"offset\":0"), "no_such_region", NULL},
      {PUT("\"shape\":[1],\"region\":0,\"offset\":0"), "no_such_region", NULL},
      {PUT("\"shape\":[1],\"region\":1"), "invalid_argument", "offset"},
      {PUT("\"shape\":[1],\"offset\":0"), "invalid_argument", "region"},
      /* the last four bytes exactly: fine */
      {PUT("\"shape\":[1],\"region\":1,\"offset\":4092"), "ok", NULL},
  };
  run_lines(c, lines, sizeof lines / sizeof lines[0]);
  /* region ids belong to their connection */
  x_err(x_call(other, "{\"op\":\"put\",\"save\":\"past2\",\"name\":\"w\",\"dtype\":\"F32\",\"shape\":[1],"
                      "\"region\":1,\"offset\":0}"),
        "no_such_region", NULL, "another connection's region");
  x_ok(x_call(other, "{\"op\":\"abort\",\"save\":\"past2\"}"), "abort");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"past\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"past\"}"), "wait");
  uint8_t want[4];
  for (int i = 0; i < 4; i++) want[i] = (uint8_t)(((4092 + i) * 7 + 3) & 0xff);
  h_check_bytes("past/a", "w", want, 4);
  x_close(c);
  x_close(other);
  close(fd);
  shm_unlink(name);
  x_serving();
}

Test(hostile, half_lines_stall_or_vanish_without_blocking_others) {
  /* stalls (the default line_timeout is 60 s): everybody else is served meanwhile */
  x_conn *stall = x_connect();
  x_send(stall, "{\"op\":\"begin\",\"save\":\"half\",\"dir\":\"half/a\",\"ra", 44);
  x_conn *stall2 = x_connect();
  x_send(stall2, "{", 1);
  x_serving();
  x_serving();
  /* vanishes mid-line: nothing half-parsed survives */
  x_close(stall);
  x_conn *c = x_connect();
  x_status_ok(c, 0);
  /* pipelined: 10,000 requests in one write, every one answered in order */
  const int nreq = X_SANITIZED ? 2000 : 10000;
  size_t cap = (size_t)nreq * 40, n = 0;
  char *burst = malloc(cap);
  for (int i = 0; i < nreq; i++) n += (size_t)snprintf(burst + n, cap - n, "{\"op\":\"status\",\"id\":%d}\n", i);
  x_send(c, burst, n);
  free(burst);
  for (int i = 0; i < nreq; i++) {
    json_t *r = x_reply(c);
    cr_assert_eq(json_integer_value(json_object_get(r, "id")), i, "replies out of order at %d", i);
    json_decref(r);
  }
  x_close(c);
  x_close(stall2);
  x_serving();
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* A reply (or the start of one) is waiting on c. */
static int has_reply(x_conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN};
  return c->len > 0 || poll(&p, 1, 0) > 0;
}

/* One long line, legal under max_line: a 4 MB hello with 330,000 unknown
 * keys, which jansson takes a while to parse and as long to free. Both run
 * on a worker, so another client is answered while the line is handled;
 * the worst `hello` wait is printed. Before, the loop parsed it and the
 * other client waited for all of it (a 15 MB line of keys: 9.2 s here). */
Test(hostile, a_long_request_line_stalls_no_other_client) {
  x_conn *a = x_connect(), *b = x_connect();
  size_t cap = 4u << 20, n = 0;
  char *line = malloc(cap + 64);
  n += (size_t)snprintf(line, cap, "{\"op\":\"hello\",\"proto\":1,\"id\":7");
  for (unsigned k = 0; n + 16 < cap; k++) n += (size_t)snprintf(line + n, cap - n, ",\"k%07u\":0", k);
  line[n++] = '}';
  x_send(a, line, n);
  free(line);
  /* every byte of it is read before its end comes */
  for (int i = 0; i < 3; i++) {
    x_ok(x_call(b, "{\"op\":\"hello\",\"proto\":1}"), "hello while the long line arrives");
    usleep(100000);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  x_send(a, "\n", 1);
  double worst = 0;
  int hellos = 0, served_meanwhile = 0;
  while (!has_reply(a)) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    x_ok(x_call(b, "{\"op\":\"hello\",\"proto\":1}"), "the other client's hello");
    double dt = seconds_since(&t1);
    worst = dt > worst ? dt : worst;
    hellos++;
    if (!has_reply(a)) served_meanwhile = 1;
    cr_assert(seconds_since(&t0) < H_WAIT_MS / 1000.0, "the long line was never answered");
  }
  json_t *r = x_reply(a);
  cr_assert_eq(json_integer_value(json_object_get(r, "id")), 7);
  x_ok(r, "the long hello");
  printf("hostile: a %zu-byte line took %.2f s to answer; the other client's worst hello waited %.3f s (%d "
         "hellos)\n", n, seconds_since(&t0), worst, hellos);
  cr_assert(served_meanwhile, "the other client was answered only after the long line");
  x_status_ok(a, -1); /* the lines behind it are served */
  x_close(a);
  x_close(b);
  x_serving();
}

Test(hostile, thousands_of_connect_disconnect_cycles) {
  char name[64];
  snprintf(name, sizeof name, "/sdxt-cyc-%d", (int)getpid());
  int fd = x_shm_create(name, 4096, 5, NULL);
  x_conn *probe = x_connect();
  x_status_ok(probe, 0);
  int fds_before = x_fd_count(H.pid);
  const int cycles = X_SANITIZED ? 600 : 3000;
  for (int i = 0; i < cycles; i++) {
    x_conn *c = x_connect();
    switch (i % 6) {
      case 0: /* connect and leave */
        break;
      case 1: /* half a line, then gone */
        x_send(c, "{\"op\":\"sta", 10);
        break;
      case 2: { /* begin, then gone before seal: the save fails with client_lost */
        json_t *r = x_callf(c, "{\"op\":\"begin\",\"save\":\"cyc-%d\",\"dir\":\"cyc/%d\",\"rank\":0,\"world_size\":2}",
                            i, i);
        x_ok(r, "begin");
        break;
      }
      case 3: { /* attach, put, then gone */
        json_t *r = x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name);
        x_ok(r, "attach");
        x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"cyca-%d\",\"dir\":\"cyca/%d\",\"rank\":0,\"world_size\":1}", i, i),
             "begin");
        x_ok(x_callf(c, "{\"op\":\"put\",\"save\":\"cyca-%d\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[16],"
                        "\"region\":1,\"offset\":0}",
                     i),
             "put");
        break;
      }
      case 4: /* requests sent, replies never read */
        x_sendf(c, "{\"op\":\"status\"}\n{\"op\":\"hello\",\"proto\":1}");
        break;
      case 5: { /* reset instead of a clean close */
        struct linger lg = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        x_sendf(c, "{\"op\":\"status\"}");
        break;
      }
    }
    x_close(c);
  }
  /* every churned connection, save and mapping is gone once the daemon has seen the closes */
  int settled = 0;
  for (int tries = 0; tries < 6000 && !settled; tries++) {
    json_t *r = x_call(probe, "{\"op\":\"status\"}");
    settled = json_integer_value(json_object_get(r, "clients")) == 1 &&
              json_array_size(json_object_get(r, "saves")) == 0 &&
              json_integer_value(json_object_get(r, "regions")) == 0;
    json_decref(r);
    if (!settled) {
      struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
    }
  }
  cr_assert(settled, "connections, saves or regions of closed clients linger");
  int fds_after = x_fd_count(H.pid);
  printf("hostile: %d connect/disconnect cycles: daemon fds %d before, %d after\n", cycles, fds_before, fds_after);
  cr_assert_eq(fds_after, fds_before, "the daemon leaks descriptors over connection churn: %d -> %d", fds_before,
               fds_after);
  cr_assert_eq(h_tmp_count(), 0);
  x_close(probe);
  close(fd);
  shm_unlink(name);
  x_serving();
}

/* A `file` may not take the name of a file the daemon writes: refused at
 * the request, whatever shape the save ends up with. */
Test(hostile, file_artifacts_named_like_the_index_a_shard_or_a_temporary_folder) {
  x_conn *c = x_connect();
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"art\",\"dir\":\"art/ck\",\"rank\":0,\"world_size\":1}"), "begin");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"art\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}"),
       "put");
  const char *names[] = {"model.safetensors.index.json", "model.safetensors", "model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors", ".shardd-tmp-art"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    json_t *r = x_callf(c, "{\"op\":\"file\",\"save\":\"art\",\"path\":\"%s\",\"data\":\"e30=\"}", names[i]);
    char frag[96];
    snprintf(frag, sizeof frag, "file '%s'", names[i]);
    x_err(r, "invalid_argument", frag, names[i]);
  }
  /* the refusals did not fail the save: it commits as a single file the reader accepts */
  x_ok(x_call(c, "{\"op\":\"file\",\"save\":\"art\",\"path\":\"config.json\",\"data\":\"e30=\"}"), "config.json");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"art\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"art\"}"), "wait");
  h_verify_ok("art/ck");
  char p[PATH_MAX];
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "art/ck")), 2, "model.safetensors and config.json, nothing else");
  /* with another prefix, the names follow it */
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"ema\",\"dir\":\"art/ema\",\"rank\":0,\"world_size\":1,"
                 "\"prefix\":\"ema\"}"),
       "begin ema");
  x_err(x_call(c, "{\"op\":\"file\",\"save\":\"ema\",\"path\":\"ema.safetensors.index.json\",\"data\":\"e30=\"}"),
        "invalid_argument", "ema.safetensors.index.json", "ema's index");
  x_ok(x_call(c, "{\"op\":\"abort\",\"save\":\"ema\"}"), "abort ema");
  x_close(c);
  x_serving();
}
