/* Peer connections over TCP: connector with retries, mutual HMAC handshake, frames, queued sends (the net: peer_net.c; strangers: peer_strangers.c). */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "sd_escape.h"
#include "sd_msg.h"

static void try_connect(sd_peer *p);
static void send_hello(sd_peer *p);
static void on_retry(uv_timer_t *t);

/* ------------------------------------------------------------------------ *
 * Small helpers
 * ------------------------------------------------------------------------ */

static void unauth_done(sd_peer *p) {
  if (!p->unauth) return;
  p->unauth = 0;
  p->net->nunauth--;
}

/* ------------------------------------------------------------------------ *
 * Tear-down: every handle closes first; on_lost runs from the last close
 * callback, so no caller of sd_peer_close is ever re-entered.
 * ------------------------------------------------------------------------ */
void sd_peer_net_maybe_free(sd_peer_net *net) {
  if (!net->closing || net->handles || net->npeers) return;
  memset(net->token, 0, net->token_len);
  free(net->token);
  free(net);
}

static void peer_free(sd_peer *p) {
  sd_peer_net *net = p->net;
  if (p->prev) p->prev->next = p->next;
  else if (net->peers == p) net->peers = p->next;
  if (p->next) p->next->prev = p->prev;
  net->npeers--;
  for (qframe *f = p->q; f;) {
    qframe *n = f->next;
    free(f->buf);
    free(f);
    f = n;
  }
  sd_frame_reader_free(&p->rd);
  free(p->stash);
  if (p->notify && net->h.on_lost && !net->closing)
    net->h.on_lost(net, p, p->lost_code ? p->lost_code : SHARDD_E_PEER_LOST, p->lost_why);
  free(p);
  sd_peer_net_maybe_free(net);
}

static void handle_gone(sd_peer *p) {
  if (--p->handles == 0 && p->state == P_CLOSING) peer_free(p);
}

static void on_tcp_closed(uv_handle_t *h) {
  sd_peer *p = h->data;
  p->tcp_open = p->tcp_closing = 0;
  if (p->state != P_CLOSING && p->outgoing) {
    /* A failed connect attempt: try again until the deadline. */
    p->handles--;
    if (now_ms(p->net) + RETRY_MS < p->deadline && !p->net->closing) {
      uv_timer_start(&p->retry, on_retry, RETRY_MS, 0);
      return;
    }
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "cannot reach %s: %s", p->addr, p->last_err);
    return;
  }
  handle_gone(p);
}

static void on_timer_closed(uv_handle_t *h) { handle_gone(h->data); }

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  sd_peer *p = req->data;
  uv_close((uv_handle_t *)&p->tcp, on_tcp_closed);
}

static void close_handles(sd_peer *p) {
  if (p->tcp_open && !p->tcp_closing) {
    p->tcp_closing = 1;
    p->shut.data = p;
    if (!p->linger || uv_shutdown(&p->shut, (uv_stream_t *)&p->tcp, on_shutdown) != 0)
      uv_close((uv_handle_t *)&p->tcp, on_tcp_closed);
  }
  if (p->retry_open) {
    p->retry_open = 0;
    uv_close((uv_handle_t *)&p->retry, on_timer_closed);
  }
  if (p->gai_active) uv_cancel((uv_req_t *)&p->gai);
}

void sd_peer_fail(sd_peer *p, int code, const char *fmt, ...) {
  if (p->state == P_CLOSING) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->lost_why, sizeof p->lost_why, fmt, ap);
  va_end(ap);
  p->lost_code = code;
  p->state = P_CLOSING;
  unauth_done(p);
  /* Nothing outside this file ever saw an incoming connection that did not log in. */
  if (!p->outgoing && !p->ever_ready) p->notify = 0;
  if (p->handles == 0) {
    peer_free(p);
    return;
  }
  close_handles(p);
}

void sd_peer_close(sd_peer *p, const char *why) {
  if (p->state == P_CLOSING) return;
  sd_log_debug("peer %s: closing: %s", sd_peer_who(p), why);
  sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s", why);
}

/* ------------------------------------------------------------------------ *
 * Writing
 * ------------------------------------------------------------------------ */
static void on_write(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  sd_peer *p = w->p;
  free(w->buf);
  free(w);
  if (status < 0 && status != UV_ECANCELED && p->state != P_CLOSING)
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "connection to %s broke: %s", sd_peer_who(p), uv_strerror(status));
}

static int write_raw(sd_peer *p, uint8_t *buf, size_t len) {
  wreq *w = malloc(sizeof *w);
  if (!w) {
    free(buf);
    return SHARDD_E_NO_MEMORY;
  }
  w->p = p;
  w->buf = buf;
  w->len = len;
  uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&p->tcp, &b, 1, on_write);
  if (rc < 0) {
    free(buf);
    free(w);
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "cannot write to %s: %s", sd_peer_who(p), uv_strerror(rc));
    return SHARDD_E_PEER_LOST;
  }
  p->net->bytes_tx += len;
  return 0;
}

static int send_framev(sd_peer *p, json_t *hdr, const struct iovec *iov, int niov, int queue_ok) {
  if (p->state == P_CLOSING) {
    json_decref(hdr);
    return SHARDD_E_PEER_LOST;
  }
  size_t len = 0;
  uint8_t *buf = hdr ? sd_frame_encodev(hdr, iov, niov, &len) : NULL;
  json_decref(hdr);
  if (!buf) return SHARDD_E_NO_MEMORY;
  if (p->state == P_READY || !queue_ok) return write_raw(p, buf, len);
  qframe *f = malloc(sizeof *f);
  if (!f) {
    free(buf);
    return SHARDD_E_NO_MEMORY;
  }
  f->buf = buf;
  f->len = len;
  f->next = NULL;
  *p->qtail = f;
  p->qtail = &f->next;
  p->qbytes += len;
  return 0;
}

static int send_frame(sd_peer *p, json_t *hdr, const void *payload, size_t plen, int queue_ok) {
  struct iovec iov = {.iov_base = (void *)payload, .iov_len = plen};
  return send_framev(p, hdr, &iov, plen ? 1 : 0, queue_ok);
}

int sd_peer_send(sd_peer *p, json_t *hdr, const void *payload, size_t plen) {
  return send_frame(p, hdr, payload, plen, 1);
}

int sd_peer_sendv(sd_peer *p, json_t *hdr, const struct iovec *iov, int niov) {
  return send_framev(p, hdr, iov, niov, 1);
}

int sd_peer_send_frame(sd_peer *p, uint8_t *frame, size_t len) {
  if (p->state == P_CLOSING) {
    free(frame);
    return SHARDD_E_PEER_LOST;
  }
  if (p->state == P_READY) return write_raw(p, frame, len);
  qframe *f = malloc(sizeof *f);
  if (!f) {
    free(frame);
    return SHARDD_E_NO_MEMORY;
  }
  f->buf = frame;
  f->len = len;
  f->next = NULL;
  *p->qtail = f;
  p->qtail = &f->next;
  p->qbytes += len;
  return 0;
}

sd_peer *sd_peer_find(sd_peer_net *net, uint64_t id) {
  for (sd_peer *p = net->peers; p; p = p->next)
    if (p->id == id && p->state != P_CLOSING) return p;
  return NULL;
}

/* Handshake and errors go out at once, ahead of queued frames. */
static void send_now(sd_peer *p, json_t *hdr) { send_frame(p, hdr, NULL, 0, 0); }

static void refuse(sd_peer *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(sd_peer *p, int code, const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!p->outgoing && !p->ever_ready)
    sd_peer_log_stranger(p->net, "peer connection from %s: refused: %s", sd_peer_who(p), msg);
  else
    sd_log_warn("peer %s: refused: %s", sd_peer_who(p), msg);
  /* Tell the other side why, so its operator sees the reason too. */
  json_t *e = json_pack("{s:s,s:s,s:s}", "t", "error", "code", sd_err_name(code), "message", msg);
  if (e) send_now(p, e);
  p->linger = 1;
  sd_peer_fail(p, code, "%s", msg);
}

static void go_ready(sd_peer *p) {
  if (!p->outgoing && p->net->npeers - p->net->nunauth >= MAX_PEERS) {
    refuse(p, SHARDD_E_LIMIT, "too many peers (at most %d authenticated connections)", MAX_PEERS);
    return;
  }
  unauth_done(p);
  p->state = P_READY;
  p->ever_ready = 1;
  p->hs_deadline = 0;
  sd_log_info("peer %s: authenticated (%s)", sd_peer_who(p), p->outgoing ? "we connected" : "it connected");
  qframe *f = p->q;
  p->q = NULL;
  p->qtail = &p->q;
  p->qbytes = 0;
  while (f) {
    qframe *n = f->next;
    if (p->state == P_READY) write_raw(p, f->buf, f->len);
    else free(f->buf);
    free(f);
    f = n;
  }
}

/* ------------------------------------------------------------------------ *
 * Handshake
 * ------------------------------------------------------------------------ */
static void send_hello(sd_peer *p) {
  char nonce[2 * SD_PEER_NONCE_LEN + 1], listen[SD_PEER_ADDR_MAX];
  sd_peer_hex(p->nonce, SD_PEER_NONCE_LEN, nonce);
  json_t *h = json_pack("{s:s,s:i,s:s,s:s}", "t", "hello", "v", SD_PEER_PROTO, "node", p->net->node, "nonce", nonce);
  if (p->outgoing) {
    sd_peer_announced_listen(p, listen, sizeof listen);
    if (listen[0]) json_object_set_new(h, "listen", json_string(listen));
  }
  send_now(p, h);
}

/* This connection as both sides see it: who dialled, both names, both nonces. */
static sd_peer_transcript transcript(const sd_peer *p) {
  const sd_peer_net *net = p->net;
  if (p->outgoing)
    return (sd_peer_transcript){.connector = net->node, .acceptor = p->name, .connector_nonce = p->nonce,
                                .acceptor_nonce = p->peer_nonce};
  return (sd_peer_transcript){.connector = p->name, .acceptor = net->node, .connector_nonce = p->peer_nonce,
                              .acceptor_nonce = p->nonce};
}

static void send_auth(sd_peer *p, const char *role) {
  uint8_t mac[SD_PEER_MAC_LEN];
  char hex[2 * SD_PEER_MAC_LEN + 1];
  sd_peer_transcript t = transcript(p);
  if (sd_peer_proof(p->net->token, p->net->token_len, role, &t, mac) != 0) {
    sd_peer_fail(p, SHARDD_E_INTERNAL, "cannot compute the peer proof");
    return;
  }
  sd_peer_hex(mac, sizeof mac, hex);
  send_now(p, json_pack("{s:s,s:s}", "t", "auth", "proof", hex));
}

/* A nonce this daemon picked for one of its own connections: a peer that hands it back is relaying
 * this daemon's own words (a reflection), never a daemon with a fresh nonce of its own. */
static int nonce_is_ours(const sd_peer_net *net, const uint8_t nonce[SD_PEER_NONCE_LEN]) {
  for (const sd_peer *q = net->peers; q; q = q->next)
    if (memcmp(q->nonce, nonce, SD_PEER_NONCE_LEN) == 0) return 1; /* nonces are public */
  return 0;
}

/* The peer's hello: version, name and nonce. */
static int take_hello(sd_peer *p, json_t *h) {
  sd_peer_hello hello;
  sd_error err;
  int rc = sd_peer_hello_parse(h, &hello, &err);
  if (rc) {
    refuse(p, rc, "%s", err.msg);
    return -1;
  }
  /* A daemon never dials itself (its own participant talks to its leader in process), so this
   * daemon's name or nonce coming back is its own handshake relayed, or a second daemon with its name. */
  if (strcmp(hello.name, p->net->node) == 0) {
    refuse(p, SHARDD_E_PERMISSION, "the peer claims this daemon's own node name '%s' (node names must be unique)",
           p->net->node);
    return -1;
  }
  if (nonce_is_ours(p->net, hello.nonce)) {
    refuse(p, SHARDD_E_PERMISSION, "the peer's nonce is one this daemon picked (a relayed handshake)");
    return -1;
  }
  memcpy(p->peer_nonce, hello.nonce, sizeof p->peer_nonce);
  snprintf(p->name, sizeof p->name, "%s", hello.name);
  if (!p->outgoing && hello.listen[0]) snprintf(p->addr, sizeof p->addr, "%s", hello.listen);
  return 0;
}

static void handshake(sd_peer *p, json_t *h) {
  const char *t = json_string_value(json_object_get(h, "t"));
  if (t && strcmp(t, "error") == 0) {
    const char *code = json_string_value(json_object_get(h, "code"));
    const char *msg = json_string_value(json_object_get(h, "message"));
    int c = code ? sd_err_from_name(code) : SHARDD_E_PEER_LOST;
    if (c == SHARDD_E_PROTOCOL) c = SHARDD_E_PEER_LOST;
    sd_escbuf m;
    sd_esc(&m, msg ? msg : "no reason given");
    if (p->outgoing)
      sd_log_warn("peer %s refused us: %s", sd_peer_who(p), m.s);
    else
      sd_peer_log_stranger(p->net, "peer connection from %s sent an error before logging in: %s", sd_peer_who(p), m.s);
    sd_peer_fail(p, c, "%s refused this daemon: %s", sd_peer_who(p), m.s);
    return;
  }
  if (p->state == P_HELLO_WAIT) {
    if (!t || strcmp(t, "hello") != 0) {
      sd_escbuf tb;
      refuse(p, SHARDD_E_PROTOCOL, "expected hello, got '%.40s'", sd_esc(&tb, t ? t : "?"));
      return;
    }
    if (take_hello(p, h) != 0) return;
    if (p->outgoing) {
      send_auth(p, "connector");
    } else {
      send_hello(p);
    }
    p->state = P_AUTH_WAIT;
    return;
  }
  /* P_AUTH_WAIT */
  if (!t || strcmp(t, "auth") != 0) {
    sd_escbuf tb;
    refuse(p, SHARDD_E_PROTOCOL, "expected auth, got '%.40s'", sd_esc(&tb, t ? t : "?"));
    return;
  }
  const char *proof = json_string_value(json_object_get(h, "proof"));
  const char *role = p->outgoing ? "acceptor" : "connector";
  sd_peer_transcript tr = transcript(p);
  if (!sd_peer_proof_check(p->net->token, p->net->token_len, role, &tr, proof)) {
    refuse(p, SHARDD_E_PERMISSION, "peer authentication failed: wrong proof of the shared token "
           "(check --peer-token-file on both nodes)");
    return;
  }
  if (!p->outgoing) send_auth(p, "acceptor");
  if (p->state == P_CLOSING) return;
  go_ready(p);
}

/* ------------------------------------------------------------------------ *
 * Reading
 * ------------------------------------------------------------------------ */
static int frame_cap(void *ud, const char *kind, size_t *header_max, size_t *payload_max, sd_error *err) {
  sd_peer *p = ud;
  *header_max = SD_PEER_CONTROL_MAX;
  *payload_max = 0;
  if (!strcmp(kind, "ping") || !strcmp(kind, "error") || !p->net->h.frame_cap) return 0;
  return p->net->h.frame_cap(p->net, p, kind, header_max, payload_max, err);
}

static int on_frame(void *ud, json_t *hdr, uint8_t *payload, size_t plen) {
  sd_peer *p = ud;
  if (p->state == P_CLOSING) {
    json_decref(hdr);
    free(payload);
    return 1;
  }
  if (p->state != P_READY) {
    free(payload);
    handshake(p, hdr);
    json_decref(hdr);
    if (p->state == P_READY) {
      /* From now on the peer may send what this daemon expects of it, each kind up to its size. */
      p->rd.header_max = SD_PEER_HEADER_MAX;
      p->rd.payload_max = SD_PEER_PAYLOAD_MAX;
      p->rd.cap = frame_cap;
      p->rd.cap_ud = p;
      p->rd.offload = 1;
    }
    return p->state == P_CLOSING;
  }
  const char *t = json_string_value(json_object_get(hdr, "t"));
  if (t && strcmp(t, "ping") == 0) {
    json_decref(hdr);
    free(payload);
    return 0;
  }
  if (t && strcmp(t, "error") == 0) {
    const char *msg = json_string_value(json_object_get(hdr, "message"));
    const char *code = json_string_value(json_object_get(hdr, "code"));
    int c = code ? sd_err_from_name(code) : SHARDD_E_PEER_LOST;
    sd_escbuf m;
    sd_esc(&m, msg ? msg : "?");
    sd_log_warn("peer %s closed the connection: %s", sd_peer_who(p), m.s);
    sd_peer_fail(p, c == SHARDD_E_PROTOCOL ? SHARDD_E_PEER_LOST : c, "%s closed the connection: %s", sd_peer_who(p), m.s);
    json_decref(hdr);
    free(payload);
    return 1;
  }
  if (p->parsed_later) {
    p->parsed_later = 0;
    p->net->h.on_frame(p->net, p, json_incref(hdr), payload, plen);
    sd_peer_free_later(p->net->loop, hdr);
  } else {
    p->net->h.on_frame(p->net, p, hdr, payload, plen);
  }
  return p->state == P_CLOSING;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  sd_peer *p = h->data;
  /* The rest of a large payload is read straight into place. */
  size_t room = 0;
  uint8_t *direct = p->state == P_READY ? sd_frame_direct(&p->rd, &room) : NULL;
  if (direct && room >= (64u << 10)) {
    *buf = uv_buf_init((char *)direct, (unsigned)(room > (1u << 30) ? 1u << 30 : room));
    return;
  }
  /* One buffer for every connection: the loop reads one socket at a time
   * and each read is consumed before the next alloc. */
  *buf = uv_buf_init((char *)p->net->rbuf, READ_BUF);
}

static void feed(sd_peer *p, const uint8_t *buf, size_t n);

/* A long header parsed off the loop: the bytes read past it go on, then reading resumes. */
static void on_parsed(void *ud, int rc, const sd_error *err) {
  sd_peer *p = ud;
  p->parsing = 0;
  uint8_t *rest = p->stash;
  size_t n = p->stash_len;
  p->stash = NULL;
  p->stash_len = 0;
  if (p->state == P_CLOSING) {
    free(rest);
    handle_gone(p);
    return;
  }
  p->handles--;
  p->last_rx = now_ms(p->net);
  p->parsed_later = 1;
  if (rc) {
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s sent a malformed frame: %s", sd_peer_who(p), err->msg);
  } else {
    feed(p, NULL, 0); /* the frame may be whole already */
    if (p->state != P_CLOSING && !p->parsing) feed(p, rest, n);
    if (p->state != P_CLOSING && !p->parsing) sd_peer_start_reading(p);
  }
  free(rest);
}

static void feed(sd_peer *p, const uint8_t *buf, size_t n) {
  sd_error err = {0};
  size_t used = 0;
  int rc = sd_frame_feed_some(&p->rd, buf, n, &used, on_frame, p, &err);
  if (rc == SD_FRAME_PARSE_PENDING && p->state != P_CLOSING) {
    /* Keep what came after the header (the loop's read buffer is shared) and read no more until it is parsed. */
    if (n > used && !(p->stash = malloc(n - used))) {
      sd_peer_fail(p, SHARDD_E_NO_MEMORY, "out of memory reading from %s", sd_peer_who(p));
      return;
    }
    if (n > used) memcpy(p->stash, buf + used, n - used);
    p->stash_len = n - used;
    uv_read_stop((uv_stream_t *)&p->tcp);
    p->parsing = 1;
    p->handles++;
    if (sd_peer_parse_off_loop(p->net->loop, &p->rd, on_parsed, p) != 0) {
      sd_error e = {0};
      on_parsed(p, sd_frame_parse_header(&p->rd, &e), &e);
    }
    return;
  }
  if (rc && rc != 1 && p->state != P_CLOSING) {
    if (rc == SHARDD_E_LIMIT)
      refuse(p, SHARDD_E_LIMIT, "%s, from %s", err.msg, sd_peer_who(p)); /* refused unread: the other side hears why */
    else if (p->state == P_READY)
      sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s sent a malformed frame: %s", sd_peer_who(p), err.msg);
    else
      refuse(p, SHARDD_E_PROTOCOL, "malformed frame during the handshake: %s", err.msg);
  }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  sd_peer *p = s->data;
  if (n == 0) return;
  if (n < 0) {
    if (p->state != P_CLOSING)
      sd_peer_fail(p, SHARDD_E_PEER_LOST, "connection to %s %s", sd_peer_who(p),
                n == UV_EOF ? "was closed by the other side" : uv_strerror((int)n));
    return;
  }
  p->last_rx = now_ms(p->net);
  p->net->bytes_rx += (uint64_t)n;
  feed(p, (const uint8_t *)buf->base, (size_t)n);
}

void sd_peer_start_reading(sd_peer *p) {
  p->tcp.data = p;
  uv_tcp_nodelay(&p->tcp, 1);
  p->last_rx = now_ms(p->net);
  int rc = uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read);
  if (rc < 0) sd_peer_fail(p, SHARDD_E_PEER_LOST, "cannot read from %s: %s", sd_peer_who(p), uv_strerror(rc));
}

/* ------------------------------------------------------------------------ *
 * Peers: creation, connecting
 * ------------------------------------------------------------------------ */
sd_peer *sd_peer_new_conn(sd_peer_net *net, int outgoing) {
  if (outgoing && net->npeers - net->nunauth >= MAX_PEERS) return NULL;
  sd_peer *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->net = net;
  p->id = ++net->next_id;
  p->outgoing = outgoing;
  p->notify = 1;
  p->qtail = &p->q;
  /* Tiny limits until the peer proves it holds the token. */
  sd_frame_reader_init(&p->rd, SD_PEER_PREAUTH_MAX, 0);
  if (sd_peer_random(p->nonce, sizeof p->nonce) != 0) {
    free(p);
    return NULL;
  }
  p->next = net->peers;
  if (net->peers) net->peers->prev = p;
  net->peers = p;
  net->npeers++;
  return p;
}

static void on_connect(uv_connect_t *req, int status) {
  sd_peer *p = req->data;
  if (p->state == P_CLOSING) return; /* the handle's close callback finishes it */
  if (status < 0) {
    snprintf(p->last_err, sizeof p->last_err, "%s", uv_strerror(status));
    p->tcp_closing = 1;
    uv_close((uv_handle_t *)&p->tcp, on_tcp_closed);
    return;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&p->tcp, (struct sockaddr *)&ss, &len) == 0)
    sd_peer_sockaddr_str((struct sockaddr *)&ss, p->remote, sizeof p->remote);
  p->state = P_HELLO_WAIT;
  p->hs_deadline = now_ms(p->net) + p->net->handshake_ms;
  sd_peer_start_reading(p);
  if (p->state == P_HELLO_WAIT) send_hello(p);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  sd_peer *p = req->data;
  p->gai_active = 0;
  if (p->state == P_CLOSING) {
    if (res) uv_freeaddrinfo(res);
    handle_gone(p);
    return;
  }
  p->handles--;
  if (status < 0 || !res) {
    if (res) uv_freeaddrinfo(res);
    snprintf(p->last_err, sizeof p->last_err, "cannot resolve the host: %s", uv_strerror(status));
    if (now_ms(p->net) + RETRY_MS < p->deadline) {
      uv_timer_start(&p->retry, on_retry, RETRY_MS, 0);
      return;
    }
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "cannot reach %s: %s", p->addr, p->last_err);
    return;
  }
  uv_tcp_init(p->net->loop, &p->tcp);
  p->tcp.data = p;
  p->tcp_open = 1;
  p->handles++;
  p->conn.data = p;
  p->state = P_CONNECTING;
  int rc = uv_tcp_connect(&p->conn, &p->tcp, res->ai_addr, on_connect);
  uv_freeaddrinfo(res);
  if (rc < 0) {
    snprintf(p->last_err, sizeof p->last_err, "%s", uv_strerror(rc));
    p->tcp_closing = 1;
    uv_close((uv_handle_t *)&p->tcp, on_tcp_closed);
  }
}

static void try_connect(sd_peer *p) {
  if (p->state == P_CLOSING) return;
  char host[SD_PEER_ADDR_MAX], port[16];
  unsigned pn = 0;
  sd_error err;
  if (sd_peer_addr_split(p->addr, host, sizeof host, &pn, &err) != 0) {
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s", err.msg);
    return;
  }
  snprintf(port, sizeof port, "%u", pn);
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  p->gai.data = p;
  p->state = P_RESOLVING;
  int rc = uv_getaddrinfo(p->net->loop, &p->gai, on_resolved, host, port, &hints);
  if (rc < 0) {
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "cannot resolve %s: %s", p->addr, uv_strerror(rc));
    return;
  }
  p->gai_active = 1;
  p->handles++;
}

static void on_retry(uv_timer_t *t) { try_connect(t->data); }

sd_peer *sd_peer_connect(sd_peer_net *net, const char *addr, sd_error *err) {
  for (sd_peer *p = net->peers; p; p = p->next)
    if (p->outgoing && p->state != P_CLOSING && strcmp(p->addr, addr) == 0) return p;
  char host[SD_PEER_ADDR_MAX];
  unsigned port;
  if (sd_peer_addr_split(addr, host, sizeof host, &port, err) != 0) return NULL;
  if (net->closing) {
    sd_fail(err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
    return NULL;
  }
  sd_peer *p = sd_peer_new_conn(net, 1);
  if (!p) {
    sd_fail(err, SHARDD_E_LIMIT, "cannot open another peer connection (at most %d)", MAX_PEERS);
    return NULL;
  }
  snprintf(p->addr, sizeof p->addr, "%s", addr);
  snprintf(p->last_err, sizeof p->last_err, "no answer");
  uv_timer_init(net->loop, &p->retry);
  p->retry.data = p;
  p->retry_open = 1;
  p->handles++;
  p->deadline = now_ms(net) + net->timeout_ms;
  try_connect(p);
  return p;
}

size_t sd_peer_queued(const sd_peer *p) {
  size_t n = p->qbytes;
  if (p->tcp_open && p->state == P_READY) n += uv_stream_get_write_queue_size((const uv_stream_t *)&p->tcp);
  return n;
}
int sd_peer_is_ready(const sd_peer *p) { return p->state == P_READY; }
int sd_peer_was_ready(const sd_peer *p) { return p->ever_ready; }
size_t sd_peer_frame_len(const sd_peer *p) { return 4 + (size_t)p->rd.hlen; }
int sd_peer_is_outgoing(const sd_peer *p) { return p->outgoing; }
const char *sd_peer_addr(const sd_peer *p) {
  if (!p->outgoing && !p->ever_ready) return p->remote;
  return p->addr[0] ? p->addr : p->remote;
}
const char *sd_peer_describe(const sd_peer *p) { return sd_peer_who(p); }
const char *sd_peer_name(const sd_peer *p) { return p->name; }
uint64_t sd_peer_id(const sd_peer *p) { return p->id; }
