/* Peer frame codec: u32 big-endian header length, a JSON object header, then `len` raw payload bytes. Pure. */
#include <stdlib.h>
#include <string.h>

#include "peer_frame.h"
#include "sd_msg.h"

void sd_frame_reader_init(sd_frame_reader *r, size_t header_max, size_t payload_max) {
  memset(r, 0, sizeof *r);
  r->header_max = header_max;
  r->payload_max = payload_max;
}

uint8_t *sd_frame_direct(sd_frame_reader *r, size_t *room) {
  if (r->stage != 2 || !r->payload || r->have >= r->plen) return NULL;
  *room = (size_t)(r->plen - r->have);
  return r->payload + r->have;
}

void sd_frame_reader_free(sd_frame_reader *r) {
  free(r->hdr);
  free(r->payload);
  json_decref(r->parsed);
  r->hdr = NULL;
  r->payload = NULL;
  r->parsed = NULL;
  r->stage = 0;
  r->have = 0;
}

/* The header is whole: parse it and learn how much payload follows. */
static int header_done(sd_frame_reader *r, sd_error *err) {
  json_t *h = NULL;
  sd_error e = {0};
  int rc = sd_msg_parse(r->hdr, r->hlen, &h, &e);
  free(r->hdr);
  r->hdr = NULL;
  if (rc) return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame header: %s", e.msg);
  uint64_t plen = 0;
  if (sd_msg_u64(h, "len", 0, 0, &plen, &e) < 0) {
    json_decref(h);
    return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame header: %s", e.msg);
  }
  if (plen > r->frame_payload_max) {
    json_decref(h);
    if (r->cap)
      return sd_fail(err, SHARDD_E_LIMIT, "peer frame '%s' with a payload of %llu bytes is over the limit of %zu for "
                     "its kind", r->kind, (unsigned long long)plen, r->frame_payload_max);
    return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame payload of %llu bytes is over the limit of %zu",
                   (unsigned long long)plen, r->frame_payload_max);
  }
  if (plen) {
    r->payload = malloc((size_t)plen);
    if (!r->payload) {
      json_decref(h);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for a %llu-byte peer payload",
                     (unsigned long long)plen);
    }
  }
  r->plen = plen;
  r->parsed = h;
  return 0;
}

int sd_frame_parse_header(sd_frame_reader *r, sd_error *err) {
  int rc = header_done(r, err);
  if (rc) return rc;
  r->stage = 2;
  r->have = 0;
  return 0;
}

/* Room for the whole header, after the bytes peeked at. */
static int header_alloc(sd_frame_reader *r, sd_error *err) {
  r->hdr = malloc(r->hlen);
  if (!r->hdr) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for a %u-byte peer frame", r->hlen);
  if (r->stage == 3) memcpy(r->hdr, r->peek, r->have);
  else r->have = 0;
  r->stage = 1;
  return 0;
}

/* The header's first bytes are in: its kind, then the limits the cap gives that kind. */
static int kind_known(sd_frame_reader *r, sd_error *err) {
  static const char open[] = "{\"t\":\"";
  size_t k = 0, at = sizeof open - 1;
  if (r->have < at || memcmp(r->peek, open, at) != 0)
    return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame header does not begin with its kind ({\"t\":...)");
  while (at + k < r->have && k < SD_FRAME_KIND_MAX &&
         ((r->peek[at + k] >= 'a' && r->peek[at + k] <= 'z') || r->peek[at + k] == '_'))
    k++;
  if (k == 0 || at + k >= r->have || r->peek[at + k] != '"')
    return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame header does not begin with its kind ({\"t\":...)");
  memcpy(r->kind, r->peek + at, k);
  r->kind[k] = '\0';
  size_t hmax = r->header_max, pmax = r->payload_max;
  int rc = r->cap(r->cap_ud, r->kind, &hmax, &pmax, err);
  if (rc) return rc;
  if (r->hlen > hmax)
    return sd_fail(err, SHARDD_E_LIMIT, "peer frame '%s' of %u bytes is over the limit of %zu for its kind", r->kind,
                   r->hlen, hmax);
  r->frame_payload_max = pmax < r->payload_max ? pmax : r->payload_max;
  return header_alloc(r, err);
}

int sd_frame_feed(sd_frame_reader *r, const uint8_t *buf, size_t n, sd_frame_cb cb, void *ud,
                  sd_error *err) {
  size_t used = 0;
  return sd_frame_feed_some(r, buf, n, &used, cb, ud, err);
}

int sd_frame_feed_some(sd_frame_reader *r, const uint8_t *buf, size_t n, size_t *used, sd_frame_cb cb, void *ud,
                       sd_error *err) {
  *used = 0;
  for (;;) {
    if (r->stage == 2 && r->have == r->plen) {
      json_t *h = r->parsed;
      uint8_t *payload = r->payload;
      size_t plen = (size_t)r->plen;
      r->parsed = NULL;
      r->payload = NULL;
      r->stage = 0;
      r->have = 0;
      int rc = cb(ud, h, payload, plen);
      if (rc) return rc;
      continue;
    }
    if (n == 0) return 0;
    size_t peek = r->hlen < SD_FRAME_PEEK ? r->hlen : SD_FRAME_PEEK;
    size_t want = r->stage == 0   ? 4 - r->have
                  : r->stage == 3 ? peek - r->have
                  : r->stage == 1 ? r->hlen - r->have
                                  : (size_t)(r->plen - r->have);
    size_t k = want < n ? want : n;
    uint8_t *dst = r->stage == 0 ? r->lenbuf : r->stage == 3 ? r->peek : r->stage == 1 ? (uint8_t *)r->hdr : r->payload;
    if (dst + r->have != buf) memcpy(dst + r->have, buf, k); /* else read in place */
    r->have += k;
    buf += k;
    n -= k;
    *used += k;
    if (r->stage == 0 && r->have == 4) {
      r->hlen = (uint32_t)r->lenbuf[0] << 24 | (uint32_t)r->lenbuf[1] << 16 | (uint32_t)r->lenbuf[2] << 8 |
                r->lenbuf[3];
      if (r->hlen == 0 || r->hlen > r->header_max)
        return sd_fail(err, SHARDD_E_PROTOCOL, "peer frame header of %u bytes (limit %zu)", r->hlen,
                       r->header_max);
      r->frame_payload_max = r->payload_max;
      r->have = 0;
      if (r->cap) {
        r->stage = 3; /* nothing buffered beyond the kind until the cap allows it */
      } else {
        int rc = header_alloc(r, err);
        if (rc) return rc;
      }
    } else if (r->stage == 3 && (r->have == peek || (r->have > 6 && memchr(r->peek + 6, '"', r->have - 6)))) {
      /* the whole peek, or the kind's closing quote: decide now */
      int rc = kind_known(r, err);
      if (rc) return rc;
    }
    if (r->stage == 1 && r->have == r->hlen) {
      if (r->offload && r->hlen >= SD_FRAME_PARSE_LATER) return SD_FRAME_PARSE_PENDING;
      int rc = sd_frame_parse_header(r, err);
      if (rc) return rc;
    }
  }
}

/* The header's "t" first, for a reader that limits each kind from its first bytes. */
static json_t *kind_first(json_t *hdr) {
  json_t *t = json_object_get(hdr, "t");
  void *it = json_object_iter(hdr);
  if (!t || (it && !strcmp(json_object_iter_key(it), "t"))) return json_incref(hdr);
  json_t *out = json_object();
  if (!out || json_object_set(out, "t", t) != 0 || json_object_update(out, hdr) != 0) {
    json_decref(out);
    return NULL;
  }
  return out;
}

/* The header's JSON with "t" first; NULL when it cannot be encoded. */
static char *dump_header(json_t *hdr) {
  json_t *h = kind_first(hdr);
  char *js = h ? json_dumps(h, JSON_COMPACT) : NULL;
  json_decref(h);
  return js;
}

uint8_t *sd_frame_alloc(json_t *hdr, size_t plen, size_t *payload_at, size_t *out_len) {
  if (plen) json_object_set_new(hdr, "len", json_integer((json_int_t)plen));
  char *js = dump_header(hdr);
  if (!js) return NULL;
  size_t hl = strlen(js);
  uint8_t *buf = hl <= SD_PEER_HEADER_MAX ? malloc(4 + hl + plen) : NULL;
  if (!buf) {
    free(js);
    return NULL;
  }
  buf[0] = (uint8_t)(hl >> 24);
  buf[1] = (uint8_t)(hl >> 16);
  buf[2] = (uint8_t)(hl >> 8);
  buf[3] = (uint8_t)hl;
  memcpy(buf + 4, js, hl);
  free(js);
  *payload_at = 4 + hl;
  *out_len = 4 + hl + plen;
  return buf;
}

uint8_t *sd_frame_encode(json_t *hdr, const void *payload, size_t plen, size_t *out_len) {
  struct iovec iov = {.iov_base = (void *)payload, .iov_len = plen};
  return sd_frame_encodev(hdr, &iov, plen ? 1 : 0, out_len);
}

uint8_t *sd_frame_encodev(json_t *hdr, const struct iovec *iov, int niov, size_t *out_len) {
  size_t plen = 0;
  for (int i = 0; i < niov; i++) plen += iov[i].iov_len;
  if (plen) json_object_set_new(hdr, "len", json_integer((json_int_t)plen));
  char *js = dump_header(hdr);
  if (!js) return NULL;
  size_t hl = strlen(js);
  if (hl > SD_PEER_HEADER_MAX) {
    free(js);
    return NULL;
  }
  uint8_t *buf = malloc(4 + hl + plen);
  if (!buf) {
    free(js);
    return NULL;
  }
  buf[0] = (uint8_t)(hl >> 24);
  buf[1] = (uint8_t)(hl >> 16);
  buf[2] = (uint8_t)(hl >> 8);
  buf[3] = (uint8_t)hl;
  memcpy(buf + 4, js, hl);
  size_t at = 4 + hl;
  for (int i = 0; i < niov; i++) {
    if (iov[i].iov_len) memcpy(buf + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  free(js);
  *out_len = 4 + hl + plen;
  return buf;
}
