/* Configured limits: each refused with limit_exceeded naming the limit and its value, and the daemon keeps serving. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "xclient.h"

TestSuite(limits, .init = x_init, .fini = x_fini, .timeout = 120);

static void nap(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void begin(x_conn *c, const char *save, const char *dir, int rank, int world) {
  char what[128];
  snprintf(what, sizeof what, "begin %s rank %d", save, rank);
  x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":%d,\"world_size\":%d}", save, dir, rank,
               world),
       what);
}

/* One U8 element, value 1, inline. */
static json_t *put_u8(x_conn *c, const char *save, const char *name) {
  return x_callf(c, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"%s\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
                 save, name);
}

/* ------------------------------------------------------------------------ */
Test(limits, line_longer_than_max_line_is_refused_and_the_connection_closed) {
  const char *flags[] = {"--max-line", "1024", NULL};
  x_start(flags);
  x_conn *c = x_connect(), *other = x_connect();
  char line[1500];
  memset(line, 'x', sizeof line);
  x_send(c, line, sizeof line);
  x_send(c, "\n", 1);
  x_err(x_reply(c), "limit_exceeded", "max_line=1024", "over-long line");
  cr_assert(x_wait_eof(c, X_REPLY_MS), "the connection stays open after an over-long line");
  /* exactly max_line bytes are fine */
  char ok[1025];
  memset(ok, ' ', 1024);
  memcpy(ok, "{\"op\":\"status\"}", 15);
  ok[1024] = 0;
  json_t *r = x_call(other, ok);
  cr_assert(json_is_true(json_object_get(r, "ok")), "a line of exactly max_line bytes is refused");
  json_decref(r);
  x_close(c);
  x_close(other);
  x_serving();
}

Test(limits, connections_over_max_connections_are_refused) {
  const char *flags[] = {"--max-connections", "3", NULL};
  x_start(flags);
  x_conn *c[3];
  for (int i = 0; i < 3; i++) {
    c[i] = x_connect();
    x_status_ok(c[i], 0);
  }
  x_conn *extra = x_connect(); /* the kernel accepts; the daemon answers and hangs up */
  x_err(x_reply(extra), "limit_exceeded", "max_connections=3", "fourth connection");
  cr_assert(x_wait_eof(extra, X_REPLY_MS), "the connection over the limit stays open");
  x_close(extra);
  cr_assert(x_log_count("max_connections=3") >= 1, "no log line for the refused connection");
  /* one leaves: a newcomer gets in (once the daemon has seen the close) */
  x_close(c[0]);
  int in = 0;
  for (int tries = 0; tries < 3000 && !in; tries++) {
    x_conn *n = x_connect();
    x_sendf(n, "{\"op\":\"status\"}");
    json_t *r = x_reply(n);
    in = json_is_true(json_object_get(r, "ok"));
    json_decref(r);
    x_close(n);
    if (!in) nap(10);
  }
  cr_assert(in, "no connection accepted after one closed");
  x_close(c[1]);
  x_close(c[2]);
  /* once the daemon has seen those closes, the check below has free slots */
  int idle = 0;
  for (int tries = 0; tries < 3000 && !idle; tries++) {
    x_conn *n = x_connect();
    json_t *r = x_call(n, "{\"op\":\"status\"}");
    idle = json_integer_value(json_object_get(r, "clients")) == 1;
    json_decref(r);
    x_close(n);
    if (!idle) nap(10);
  }
  cr_assert(idle, "closed connections still count against max_connections");
  x_serving();
}

Test(limits, saves_in_flight_over_max_saves_are_refused) {
  const char *flags[] = {"--max-saves", "2", NULL};
  x_start(flags);
  x_conn *a = x_connect(), *b = x_connect();
  begin(a, "s1", "ms/s1", 0, 2);
  begin(a, "s2", "ms/s2", 0, 2);
  x_err(x_callf(b, "{\"op\":\"begin\",\"save\":\"s3\",\"dir\":\"ms/s3\",\"rank\":0,\"world_size\":1}"),
        "limit_exceeded", "max_saves=2", "third save");
  /* joining a save in flight is not a new save */
  begin(b, "s1", "ms/s1", 1, 2);
  x_ok(x_call(a, "{\"op\":\"abort\",\"save\":\"s2\"}"), "abort s2");
  begin(b, "s3", "ms/s3", 0, 1);
  x_ok(x_call(a, "{\"op\":\"abort\",\"save\":\"s1\"}"), "abort s1");
  x_ok(x_call(b, "{\"op\":\"abort\",\"save\":\"s3\"}"), "abort s3");
  x_status_ok(a, 0);
  x_close(a);
  x_close(b);
  x_serving();
}

Test(limits, tensors_and_slices_per_save) {
  const char *flags[] = {"--max-tensors", "3", "--max-slices", "5", NULL};
  x_start(flags);
  x_conn *c = x_connect();
  begin(c, "ts", "ts/ok", 0, 1);
  x_ok(put_u8(c, "ts", "t0"), "t0");
  x_ok(put_u8(c, "ts", "t1"), "t1");
  for (int i = 0; i < 3; i++)
    x_ok(x_callf(c,
                 "{\"op\":\"put\",\"save\":\"ts\",\"name\":\"t2\",\"dtype\":\"U8\",\"shape\":[3],"
                 "\"start\":[%d],\"count\":[1],\"data\":\"Ag==\"}",
                 i),
         "t2 slice");
  x_err(put_u8(c, "ts", "t3"), "limit_exceeded", "max_tensors=3", "fourth tensor");
  /* a replica of a slice is one more slice */
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"ts\",\"name\":\"t2\",\"dtype\":\"U8\",\"shape\":[3],"
                  "\"start\":[0],\"count\":[1],\"data\":\"Ag==\"}"),
        "limit_exceeded", "max_slices=5", "sixth slice");
  /* the save itself is unharmed and commits what it was given */
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"ts\"}"), "seal");
  json_t *w = x_call(c, "{\"op\":\"wait\",\"save\":\"ts\"}");
  cr_assert(json_is_true(json_object_get(w, "ok")), "the save over its limits does not commit");
  cr_assert_eq(json_integer_value(json_object_get(w, "tensors")), 3);
  json_decref(w);
  const uint8_t two[3] = {2, 2, 2}, one = 1;
  h_check_bytes("ts/ok", "t2", two, 3);
  h_check_bytes("ts/ok", "t0", &one, 1);
  x_close(c);
  x_serving();
}

Test(limits, name_length_and_dimensions_configured) {
  const char *flags[] = {"--max-name-len", "16", "--max-dims", "2", NULL};
  x_start(flags);
  x_conn *c = x_connect();
  begin(c, "nd", "nd/ok", 0, 1);
  x_err(put_u8(c, "nd", "abcdefghijklmnopq"), "limit_exceeded", "max_name_len=16", "17-byte name");
  x_ok(put_u8(c, "nd", "abcdefghijklmnop"), "16-byte name");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"nd\",\"name\":\"cube\",\"dtype\":\"U8\",\"shape\":[1,1,1],\"data\":\"AQ==\"}"),
        "limit_exceeded", "max_dims=2", "3 dimensions");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"nd\",\"name\":\"sq\",\"dtype\":\"U8\",\"shape\":[1,1],\"data\":\"AQ==\"}"),
       "2 dimensions");
  /* puts lines of libshardd's shape are scanned, not read as JSON (proto/puts_scan.c), a long one
   * off the loop; the limits configured here are still the daemon's */
  x_err(x_call(c, "{\"op\":\"puts\",\"id\":1,\"save\":\"nd\",\"slices\":[{\"name\":\"abcdefghijklmnopq\","
                  "\"dtype\":\"U8\",\"shape\":[0]}]}"),
        "limit_exceeded", "slices[0]: tensor 'abcdefghijklmnopq': a tensor name of 17 bytes is over max_name_len=16",
        "17-byte name in puts");
  char *line = malloc(64 * 1024), *o = line;
  o += sprintf(o, "{\"op\":\"puts\",\"id\":2,\"save\":\"nd\",\"slices\":[");
  for (int i = 0; i < 600; i++) o += sprintf(o, "{\"name\":\"e%d\",\"dtype\":\"U8\",\"shape\":[0]},", i);
  sprintf(o, "{\"name\":\"cube\",\"dtype\":\"U8\",\"shape\":[0,1,1]}]}");
  json_t *r = x_call(c, line);
  cr_assert_eq(json_integer_value(json_object_get(r, "accepted")), 600);
  x_err(r, "limit_exceeded", "slices[600]: tensor 'cube': 'shape' has 3 dimensions, over max_dims=2", "3 dimensions in puts");
  free(line);
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"nd\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"nd\"}"), "wait");
  x_close(c);
  x_serving();
}

Test(limits, name_length_and_dimensions_defaults) {
  x_start(NULL);
  x_conn *c = x_connect();
  begin(c, "nd", "nd/def", 0, 1);
  char name[1100];
  memset(name, 'n', 1025);
  name[1025] = 0;
  json_t *r = put_u8(c, "nd", name);
  x_err(r, "limit_exceeded", "max_name_len=1024", "1025-byte name");
  name[1024] = 0;
  x_ok(put_u8(c, "nd", name), "1024-byte name");
  char shape[128] = "[", start[128] = "[";
  for (int i = 0; i < 17; i++) {
    strcat(shape, i ? ",1" : "1");
    strcat(start, i ? ",0" : "0");
  }
  strcat(shape, "]");
  strcat(start, "]");
  x_err(x_callf(c, "{\"op\":\"put\",\"save\":\"nd\",\"name\":\"deep\",\"dtype\":\"U8\",\"shape\":%s,\"data\":\"AQ==\"}",
                shape),
        "limit_exceeded", "max_dims=16", "17 dimensions");
  x_ok(x_call(c, "{\"op\":\"abort\",\"save\":\"nd\"}"), "abort");
  x_close(c);
  x_serving();
}

Test(limits, header_over_max_header_fails_the_save_naming_the_file) {
  const char *flags[] = {"--max-header", "8192", NULL};
  x_start(flags);
  x_conn *c = x_connect();
  begin(c, "hd", "hd/big", 0, 1);
  /* ~100 entries of ~110 bytes each: a header of ~11 KB */
  for (int i = 0; i < 100; i++) {
    json_t *r = x_callf(c,
                        "{\"op\":\"put\",\"save\":\"hd\",\"name\":\"model.layers.%03d.self_attn.q_proj.weight."
                        "padding_padding\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}",
                        i);
    x_ok(r, "put");
  }
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"hd\"}"), "seal");
  x_err(x_call(c, "{\"op\":\"wait\",\"save\":\"hd\"}"), "limit_exceeded", "max_header=8192", "wait");
  h_expect_unpublished("hd/big");
  x_close(c);
  x_serving(); /* a small header still fits */
}

Test(limits, regions_per_connection) {
  const char *flags[] = {"--max-regions", "2", NULL};
  x_start(flags);
  char name[64];
  snprintf(name, sizeof name, "/sdxt-reg-%d", (int)getpid());
  int fd = x_shm_create(name, 4096, 1, NULL);
  x_conn *c = x_connect(), *other = x_connect();
  x_ok(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name), "attach 1");
  x_ok(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name), "attach 2");
  x_err(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name), "limit_exceeded", "max_regions=2", "attach 3");
  /* per connection: another one has its own allowance */
  x_ok(x_callf(other, "{\"op\":\"attach\",\"shm\":\"%s\"}", name), "attach on another connection");
  x_ok(x_call(c, "{\"op\":\"detach\",\"region\":1}"), "detach");
  x_ok(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", name), "attach after a detach");
  x_close(c);
  x_close(other);
  close(fd);
  shm_unlink(name);
  x_serving();
}

/* A client queues thousands of waits, then never reads: when the save ends
 * their answers pile up past max_output and the daemon drops the client. */
Test(limits, client_that_never_reads_is_dropped_past_max_output) {
  const char *flags[] = {"--max-output", "16384", NULL};
  x_start(flags);
  x_conn *lazy = x_connect(), *rank1 = x_connect();
  begin(lazy, "out", "out/ok", 0, 2);
  x_ok(x_call(lazy, "{\"op\":\"put\",\"save\":\"out\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],"
                    "\"start\":[0],\"count\":[1],\"data\":\"AQ==\"}"),
       "put 0");
  x_ok(x_call(lazy, "{\"op\":\"seal\",\"save\":\"out\"}"), "seal 0");
  /* 3000 waits: each answered only when the save ends */
  static char waits[3000 * 48];
  size_t n = 0;
  for (int i = 0; i < 3000; i++)
    n += (size_t)snprintf(waits + n, sizeof waits - n, "{\"op\":\"wait\",\"save\":\"out\",\"id\":%d}\n", i);
  x_send(lazy, waits, n);
  /* the status reply proves every wait before it was read */
  x_status_ok(lazy, 1);
  begin(rank1, "out", "out/ok", 1, 2);
  x_ok(x_call(rank1, "{\"op\":\"put\",\"save\":\"out\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],"
                     "\"start\":[1],\"count\":[1],\"data\":\"Ag==\"}"),
       "put 1");
  x_ok(x_call(rank1, "{\"op\":\"seal\",\"save\":\"out\"}"), "seal 1");
  x_ok(x_call(rank1, "{\"op\":\"wait\",\"save\":\"out\"}"), "the save commits");
  /* the lazy client is gone: reading now finds the start of its replies, then EOF */
  cr_assert(x_wait_eof(lazy, X_REPLY_MS), "the client over max_output is still connected");
  cr_assert(x_log_count("over max_output=16384") >= 1, "no log line names the dropped client");
  const uint8_t want[2] = {1, 2};
  h_check_bytes("out/ok", "w", want, 2);
  x_close(lazy);
  x_close(rank1);
  x_serving();
}

Test(limits, partial_line_that_stalls_times_out_without_blocking_others) {
  const char *flags[] = {"--line-timeout", "1", NULL};
  x_start(flags);
  x_conn *stall = x_connect();
  x_send(stall, "{\"op\":\"status\",\"id\":", 20);
  x_serving(); /* other clients are served while the half line sits there */
  json_t *r = x_read(stall, X_REPLY_MS);
  cr_assert_not_null(r, "the stalled client was never answered");
  x_err(r, "limit_exceeded", "line_timeout=1", "stalled half line");
  cr_assert(x_wait_eof(stall, X_REPLY_MS), "the stalled connection stays open");
  x_close(stall);
  /* a client that sends whole lines slowly is never timed out */
  x_conn *slow = x_connect();
  for (int i = 0; i < 3; i++) {
    nap(700);
    x_status_ok(slow, 0);
  }
  x_close(slow);
  x_serving();
}
