/* Peer daemons over TCP: framing, mutual HMAC-SHA256 authentication, heartbeats, queued sends. */
#ifndef SD_PEER_H
#define SD_PEER_H

#include <jansson.h>
#include <stddef.h>
#include <sys/uio.h>
#include <stdint.h>
#include <uv.h>

#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * Wire constants (proto/PEERS.md)
 * ------------------------------------------------------------------------ */
#define SD_PEER_PROTO 1
#define SD_PEER_NONCE_LEN 32
#define SD_PEER_MAC_LEN 32
#define SD_PEER_TOKEN_MIN 16             /* bytes in the shared secret */
#define SD_PEER_TOKEN_MAX 4096
#define SD_PEER_ADDR_MAX 300             /* "host:port" */
#define SD_PEER_NAME_MAX 128             /* node names */
/* Before authentication a peer may send only small frames. */
#define SD_PEER_PREAUTH_MAX (64u << 10)
/* After it: a manifest of a million slices fits; a frame beyond this is a bug or an attack. */
#define SD_PEER_HEADER_MAX (1u << 30)
#define SD_PEER_PAYLOAD_MAX (1u << 30)

/* ------------------------------------------------------------------------ *
 * Authentication (peer_auth.c): pure, so criterion checks it directly
 * ------------------------------------------------------------------------ */
/* HMAC-SHA256(token, "shardd-peer-v1" || role || own_nonce || peer_nonce);
 * role is "connector" or "acceptor", so a proof never serves the other side. */
int sd_peer_proof(const uint8_t *token, size_t token_len, const char *role,
                  const uint8_t own_nonce[SD_PEER_NONCE_LEN],
                  const uint8_t peer_nonce[SD_PEER_NONCE_LEN], uint8_t out[SD_PEER_MAC_LEN]);
/* 1 when `proof` (hex, from the wire) is the proof the peer in `role` owes
 * us; compared in constant time. */
int sd_peer_proof_check(const uint8_t *token, size_t token_len, const char *role,
                        const uint8_t peer_nonce[SD_PEER_NONCE_LEN],
                        const uint8_t own_nonce[SD_PEER_NONCE_LEN], const char *proof_hex);
/* Fresh random bytes from the library's CSPRNG; 0 or -1. */
int sd_peer_random(uint8_t *buf, size_t n);
/* Lower-case hex, NUL-terminated: out holds 2n+1 bytes. */
void sd_peer_hex(const uint8_t *in, size_t n, char *out);
/* Exactly 2n hex digits into n bytes; 0 or -1. */
int sd_peer_unhex(const char *hex, uint8_t *out, size_t n);
/* Reads the token file: the secret is its contents without trailing white
 * space, SD_PEER_TOKEN_MIN..MAX bytes. A file others may read is refused. */
int sd_peer_token_load(const char *path, uint8_t **token, size_t *len, sd_error *err);

/* What a hello carries (proto/PEERS.md), checked. */
typedef struct {
  char name[SD_PEER_NAME_MAX + 1];
  char listen[SD_PEER_ADDR_MAX];   /* the listener it announces; "" when none (or too long) */
  uint8_t nonce[SD_PEER_NONCE_LEN];
} sd_peer_hello;
/* A hello header -> out. 0; SHARDD_E_UNSUPPORTED_PROTO for another "v"; SHARDD_E_PROTOCOL for
 * a missing or malformed node name or nonce. The reason is in err. */
int sd_peer_hello_parse(const json_t *h, sd_peer_hello *out, sd_error *err);

/* "host:port" or "[v6]:port" -> host, port. 0 or SHARDD_E_INVALID_ARGUMENT. */
int sd_peer_addr_split(const char *addr, char *host, size_t hostlen, unsigned *port, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Frame decoding (pure): u32 big-endian header length, header JSON, payload
 * ------------------------------------------------------------------------ */
typedef struct {
  int stage;               /* 0 length, 1 header, 2 payload */
  uint8_t lenbuf[4];
  size_t have;             /* bytes of the current stage received */
  uint32_t hlen;
  char *hdr;
  json_t *parsed;          /* the header, while its payload arrives */
  uint64_t plen;
  uint8_t *payload;
  size_t header_max, payload_max;
} sd_frame_reader;

typedef int (*sd_frame_cb)(void *ud, json_t *hdr, uint8_t *payload, size_t plen);
void sd_frame_reader_init(sd_frame_reader *r, size_t header_max, size_t payload_max);
/* While a payload arrives: where its next bytes go and how many are still
 * missing, so a socket read can land there directly (sd_frame_feed then
 * skips the copy); NULL otherwise. */
uint8_t *sd_frame_direct(sd_frame_reader *r, size_t *room);
void sd_frame_reader_free(sd_frame_reader *r);
/* Feeds bytes; calls cb for each whole frame (cb owns hdr and payload).
 * A non-zero cb return stops and is returned. A malformed frame (length
 * over the limit, bad JSON, not an object, bad "len") returns
 * SHARDD_E_PROTOCOL with the reason in err. */
int sd_frame_feed(sd_frame_reader *r, const uint8_t *buf, size_t n, sd_frame_cb cb, void *ud,
                  sd_error *err);
/* Encodes a frame into one malloc'd buffer; sets "len" in hdr when the payload is not empty. */
uint8_t *sd_frame_encode(json_t *hdr, const void *payload, size_t plen, size_t *out_len);
uint8_t *sd_frame_encodev(json_t *hdr, const struct iovec *iov, int niov, size_t *out_len);
/* A frame whose header is encoded and whose plen payload bytes, at
 * *payload_at, are left for the caller to fill (in another thread, say). */
uint8_t *sd_frame_alloc(json_t *hdr, size_t plen, size_t *payload_at, size_t *out_len);

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
} sd_peer_handlers;

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
