/* Peer frames: round trips split at every byte, several frames per read, and hostile lengths and headers. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"

typedef struct {
  int n;
  json_t *hdr[8];
  uint8_t *payload[8];
  size_t plen[8];
} got;

static int collect(void *ud, json_t *hdr, uint8_t *payload, size_t plen) {
  got *g = ud;
  cr_assert_lt(g->n, 8);
  g->hdr[g->n] = hdr;
  g->payload[g->n] = payload;
  g->plen[g->n] = plen;
  g->n++;
  return 0;
}

static void got_free(got *g) {
  for (int i = 0; i < g->n; i++) {
    json_decref(g->hdr[i]);
    free(g->payload[i]);
  }
}

/* sd_frame_encode borrows the header; these tests build it on the spot. */
static uint8_t *encode_owned(json_t *hdr, const void *payload, size_t plen, size_t *len) {
  uint8_t *f = sd_frame_encode(hdr, payload, plen, len);
  json_decref(hdr);
  return f;
}

static uint8_t *two_frames(size_t *len) {
  size_t a = 0, b = 0;
  uint8_t data[300];
  for (int i = 0; i < 300; i++) data[i] = (uint8_t)(i * 7);
  uint8_t *f1 = encode_owned(json_pack("{s:s,s:i}", "t", "data", "k", 1), data, sizeof data, &a);
  uint8_t *f2 = encode_owned(json_pack("{s:s}", "t", "ping"), NULL, 0, &b);
  uint8_t *all = malloc(a + b);
  memcpy(all, f1, a);
  memcpy(all + a, f2, b);
  free(f1);
  free(f2);
  *len = a + b;
  return all;
}

static void check_two(const got *g) {
  cr_assert_eq(g->n, 2);
  cr_assert_str_eq(json_string_value(json_object_get(g->hdr[0], "t")), "data");
  cr_assert_eq(json_integer_value(json_object_get(g->hdr[0], "len")), 300);
  cr_assert_eq(g->plen[0], 300);
  for (int i = 0; i < 300; i++) cr_assert_eq(g->payload[0][i], (uint8_t)(i * 7));
  cr_assert_str_eq(json_string_value(json_object_get(g->hdr[1], "t")), "ping");
  cr_assert_eq(g->plen[1], 0);
  cr_assert_null(g->payload[1]);
}

Test(peer_frame, round_trip_in_one_read) {
  size_t len;
  uint8_t *buf = two_frames(&len);
  sd_frame_reader r;
  sd_frame_reader_init(&r, 1 << 20, 1 << 20);
  got g = {0};
  sd_error err = {0};
  cr_assert_eq(sd_frame_feed(&r, buf, len, collect, &g, &err), 0, "%s", err.msg);
  check_two(&g);
  got_free(&g);
  sd_frame_reader_free(&r);
  free(buf);
}

Test(peer_frame, round_trip_split_at_every_byte) {
  size_t len;
  uint8_t *buf = two_frames(&len);
  for (size_t cut = 0; cut <= len; cut++) {
    sd_frame_reader r;
    sd_frame_reader_init(&r, 1 << 20, 1 << 20);
    got g = {0};
    sd_error err = {0};
    cr_assert_eq(sd_frame_feed(&r, buf, cut, collect, &g, &err), 0);
    cr_assert_eq(sd_frame_feed(&r, buf + cut, len - cut, collect, &g, &err), 0);
    check_two(&g);
    got_free(&g);
    sd_frame_reader_free(&r);
  }
  /* And one byte at a time. */
  sd_frame_reader r;
  sd_frame_reader_init(&r, 1 << 20, 1 << 20);
  got g = {0};
  sd_error err = {0};
  for (size_t i = 0; i < len; i++) cr_assert_eq(sd_frame_feed(&r, buf + i, 1, collect, &g, &err), 0);
  check_two(&g);
  got_free(&g);
  sd_frame_reader_free(&r);
  free(buf);
}

Test(peer_frame, gathered_payload) {
  struct iovec iov[3] = {{"ab", 2}, {"", 0}, {"cde", 3}};
  size_t len = 0;
  json_t *hdr = json_pack("{s:s}", "t", "data");
  uint8_t *f = sd_frame_encodev(hdr, iov, 3, &len);
  json_decref(hdr);
  sd_frame_reader r;
  sd_frame_reader_init(&r, 1 << 20, 1 << 20);
  got g = {0};
  sd_error err = {0};
  cr_assert_eq(sd_frame_feed(&r, f, len, collect, &g, &err), 0);
  cr_assert_eq(g.n, 1);
  cr_assert_eq(g.plen[0], 5);
  cr_assert_eq(memcmp(g.payload[0], "abcde", 5), 0);
  got_free(&g);
  sd_frame_reader_free(&r);
  free(f);
}

static int feed_raw(const void *buf, size_t n, size_t hmax, size_t pmax, sd_error *err) {
  sd_frame_reader r;
  sd_frame_reader_init(&r, hmax, pmax);
  got g = {0};
  int rc = sd_frame_feed(&r, buf, n, collect, &g, err);
  got_free(&g);
  sd_frame_reader_free(&r);
  return rc;
}

Test(peer_frame, hostile_frames) {
  sd_error err = {0};
  /* A header length over the limit is refused before anything is allocated. */
  uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
  cr_assert_eq(feed_raw(huge, 4, 65536, 0, &err), SHARDD_E_PROTOCOL);
  cr_assert(strstr(err.msg, "4294967295"), "%s", err.msg);
  uint8_t zero[4] = {0, 0, 0, 0};
  cr_assert_eq(feed_raw(zero, 4, 65536, 0, &err), SHARDD_E_PROTOCOL);
  /* Not JSON, not an object, duplicate keys. */
  const char *bodies[] = {"nope", "[1,2]", "{\"t\":\"a\",\"t\":\"b\"}", "{\"len\":-1}", "{\"len\":\"x\"}"};
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    uint8_t buf[64];
    size_t bl = strlen(bodies[i]);
    buf[0] = buf[1] = buf[2] = 0;
    buf[3] = (uint8_t)bl;
    memcpy(buf + 4, bodies[i], bl);
    cr_assert_eq(feed_raw(buf, 4 + bl, 65536, 1024, &err), SHARDD_E_PROTOCOL, "'%s' accepted", bodies[i]);
  }
  /* A payload over the limit (before authentication the limit is 0). */
  uint8_t buf[64];
  const char *h = "{\"len\":10}";
  buf[0] = buf[1] = buf[2] = 0;
  buf[3] = (uint8_t)strlen(h);
  memcpy(buf + 4, h, strlen(h));
  cr_assert_eq(feed_raw(buf, 4 + strlen(h), 65536, 0, &err), SHARDD_E_PROTOCOL);
  cr_assert(strstr(err.msg, "over the limit"), "%s", err.msg);
}

/* Limits per kind: 16-byte pings, 100-byte payloads on data; anything else the reader's own. */
static int small_caps(void *ud, const char *kind, size_t *header_max, size_t *payload_max, sd_error *err) {
  (void)err;
  *(int *)ud += 1;
  if (!strcmp(kind, "ping")) *header_max = 16;
  if (!strcmp(kind, "data")) *payload_max = 100;
  return 0;
}

static void capped(sd_frame_reader *r, int *asked) {
  sd_frame_reader_init(r, 1 << 20, 1 << 20);
  r->cap = small_caps;
  r->cap_ud = asked;
}

/* A capped reader learns each frame's kind from its first bytes and refuses a frame over its
 * kind's size before buffering it; the encoder puts the kind first whatever the header's order. */
Test(peer_frame, each_kind_is_capped_before_it_is_buffered) {
  sd_frame_reader r;
  int asked = 0;
  capped(&r, &asked);
  size_t len = 0;
  uint8_t *buf = two_frames(&len); /* 300 bytes of data: over its kind's 100 */
  got g = {0};
  sd_error err = {0};
  cr_assert_eq(sd_frame_feed(&r, buf, len, collect, &g, &err), SHARDD_E_LIMIT);
  cr_assert(strstr(err.msg, "peer frame 'data' with a payload of 300 bytes is over the limit of 100 for its kind"), "%s",
            err.msg);
  cr_assert_null(r.payload, "the payload was allocated");
  got_free(&g);
  sd_frame_reader_free(&r);
  free(buf);
  /* A header over its kind's size: refused with only the length and the kind read. */
  capped(&r, &asked);
  const char big[] = "\0\0\1\0{\"t\":\"ping\",\"pad\":\"";
  cr_assert_eq(sd_frame_feed(&r, (const uint8_t *)big, sizeof big - 1, collect, &g, &err), SHARDD_E_LIMIT);
  cr_assert(strstr(err.msg, "peer frame 'ping' of 256 bytes is over the limit of 16 for its kind"), "%s", err.msg);
  cr_assert_null(r.hdr, "the header was buffered");
  sd_frame_reader_free(&r);
  /* Without its kind first: refused as malformed. */
  capped(&r, &asked);
  const char late[] = "\0\0\0\x1c{\"save\":\"x\",\"t\":\"ping\",\"n\":1}";
  cr_assert_eq(sd_frame_feed(&r, (const uint8_t *)late, sizeof late - 1, collect, &g, &err), SHARDD_E_PROTOCOL);
  cr_assert(strstr(err.msg, "does not begin with its kind"), "%s", err.msg);
  sd_frame_reader_free(&r);
  /* The encoder moves "t" first, so the same header goes through. */
  json_t *h = json_pack("{s:s,s:s,s:i}", "save", "x", "t", "ping", "n", 1);
  uint8_t *f = encode_owned(h, NULL, 0, &len);
  cr_assert_eq(memcmp(f + 4, "{\"t\":\"ping\"", 11), 0, "%.*s", (int)len - 4, f + 4);
  capped(&r, &asked);
  cr_assert_eq(sd_frame_feed(&r, f, len, collect, &g, &err), SHARDD_E_LIMIT, "28 bytes over the ping's 16");
  sd_frame_reader_free(&r);
  free(f);
  cr_assert_geq(asked, 3, "the cap was asked for each frame");
}
