/* The peer transport's one face: daemons over TCP (peer_conn.c, peer_names.c, peer_parse.c, peer_strangers.c, peer_net.c): connections, the login, heartbeats, queued sends; framing and proofs in peer_frame.h and peer_auth.h. */
#ifndef SD_PEER_H
#define SD_PEER_H

#include <jansson.h>
#include <stddef.h>
#include <sys/uio.h>
#include <stdint.h>
#include <uv.h>

#include "peer_auth.h"
#include "peer_frame.h"
#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * Connections
 * ------------------------------------------------------------------------ */
typedef struct sd_peer sd_peer;
typedef struct sd_peer_net sd_peer_net;

typedef struct {
  /* A whole frame from an authenticated peer; the callee owns hdr and payload (free()). */
  void (*on_frame)(sd_peer_net *net, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen);
  /* The connection is gone (or never came up). p is freed after this returns.
   * code: SHARDD_E_PEER_LOST, SHARDD_E_PERMISSION or SHARDD_E_UNSUPPORTED_PROTO. */
  void (*on_lost)(sd_peer_net *net, sd_peer *p, int code, const char *why);
  /* The largest frame of this kind an authenticated peer may send now (header JSON and payload),
   * from what this daemon expects of it; a larger one is refused with limit_exceeded before it is
   * buffered. 0, or an error code with the reason in err. NULL: SD_PEER_CONTROL_MAX for every kind. */
  int (*frame_cap)(sd_peer_net *net, sd_peer *p, const char *kind, size_t *header_max, size_t *payload_max,
                   sd_error *err);
} sd_peer_handlers;

/* What a control frame (ping, error, and any kind a daemon does not expect) may carry. */
#define SD_PEER_CONTROL_MAX (64u << 10)

typedef struct {
  const char *listen;      /* "ADDR:PORT" or NULL: no listener */
  const char *node_name;
  const uint8_t *token;
  size_t token_len;
  uint64_t timeout_ms;     /* a peer silent this long is lost */
  uint64_t handshake_ms;   /* a connection not logged in by then is closed; 0: timeout_ms */
  unsigned max_unauth;     /* incoming connections not yet logged in; past it the oldest goes; 0: 64 */
  unsigned fd_reserve;     /* an incoming connection that leaves fewer descriptors free is refused */
} sd_peer_opts;

int sd_peer_net_init(sd_peer_net **out, uv_loop_t *loop, const sd_peer_opts *o,
                     const sd_peer_handlers *h, void *ud, sd_error *err);
/* Closes the listener, every connection (on_lost is not called) and the timer. */
void sd_peer_net_close(sd_peer_net *net);
void *sd_peer_net_ud(const sd_peer_net *net);
/* The address the listener is bound to ("127.0.0.1:41234"), "" without one. */
const char *sd_peer_net_listen_addr(const sd_peer_net *net);
const char *sd_peer_net_node(const sd_peer_net *net);
uint64_t sd_peer_net_timeout(const sd_peer_net *net);
unsigned sd_peer_net_count(const sd_peer_net *net);
/* Incoming connections that have not logged in yet. */
unsigned sd_peer_net_unauth_count(const sd_peer_net *net);
uint64_t sd_peer_net_bytes_sent(const sd_peer_net *net);
uint64_t sd_peer_net_bytes_received(const sd_peer_net *net);

/* The outgoing connection to addr: an existing live one, or a new one that
 * retries until the timeout. Frames sent before it is up are queued. */
sd_peer *sd_peer_connect(sd_peer_net *net, const char *addr, sd_error *err);
/* Queues one frame (hdr reference stolen; payload copied). 0, or an error
 * when the connection is closing. */
int sd_peer_send(sd_peer *p, json_t *hdr, const void *payload, size_t plen);
/* The same with the payload gathered from pieces (copied into the frame). */
int sd_peer_sendv(sd_peer *p, json_t *hdr, const struct iovec *iov, int niov);
/* Sends a frame built with sd_frame_alloc (ownership taken). */
int sd_peer_send_frame(sd_peer *p, uint8_t *frame, size_t len);
/* A live connection by its id, or NULL. */
sd_peer *sd_peer_find(sd_peer_net *net, uint64_t id);
/* Closes with a reason (logged); on_lost follows from the loop. */
void sd_peer_close(sd_peer *p, const char *why);
/* Bytes queued but not yet handed to the kernel. */
size_t sd_peer_queued(const sd_peer *p);
int sd_peer_is_ready(const sd_peer *p);
/* It completed the handshake at some point (still true while it closes). */
int sd_peer_was_ready(const sd_peer *p);
/* While its handler runs: the bytes the frame being handled took on the wire (length, header). */
size_t sd_peer_frame_len(const sd_peer *p);
int sd_peer_is_outgoing(const sd_peer *p);
/* The address we dialled, or for an incoming peer the listener address it announced (before
 * login: the socket's far end). */
const char *sd_peer_addr(const sd_peer *p);
/* How logs name it: escaped, and for an incoming peer with the socket's far end (a static
 * buffer, valid until the next call). */
const char *sd_peer_describe(const sd_peer *p);
/* The peer's --node-name, once authenticated. */
const char *sd_peer_name(const sd_peer *p);
uint64_t sd_peer_id(const sd_peer *p);

#endif
