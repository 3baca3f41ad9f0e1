/* Peer connections, shared by peer_conn.c (connections, frames, handshake), peer_names.c (names in logs), peer_parse.c (large headers off the loop), peer_strangers.c (before login) and peer_net.c (listener, timers). */
#ifndef SD_PEER_INT_H
#define SD_PEER_INT_H

#include <stdint.h>
#include <uv.h>

#include "acceptor.h"
#include "log.h"
#include "peer.h"

#define READ_BUF (256u << 10)
#define RETRY_MS 200
#define MAX_PEERS 1024            /* authenticated connections, and outgoing ones */
#define HANDSHAKE_TICK_MIN 50

typedef enum { P_RESOLVING, P_CONNECTING, P_HELLO_WAIT, P_AUTH_WAIT, P_READY, P_CLOSING } peer_state;

typedef struct qframe {
  uint8_t *buf;
  size_t len;
  struct qframe *next;
} qframe;

typedef struct {
  uv_write_t req;
  sd_peer *p;
  uint8_t *buf;
  size_t len;
} wreq;

struct sd_peer {
  sd_peer_net *net;
  uint64_t id;
  int outgoing;
  peer_state state;
  char addr[SD_PEER_ADDR_MAX];     /* dialled, or announced by an incoming peer */
  char remote[SD_PEER_ADDR_MAX];   /* the socket's far end, for logs */
  char name[SD_PEER_NAME_MAX + 1];
  uint8_t nonce[SD_PEER_NONCE_LEN], peer_nonce[SD_PEER_NONCE_LEN];
  sd_frame_reader rd;
  uint64_t last_rx, deadline;
  uint64_t hs_deadline;            /* the handshake must end by then; 0 when not started */
  int unauth;                      /* incoming, not yet authenticated: counts in net->nunauth */
  uint64_t source;                 /* its source network (source_of), for fair eviction */
  qframe *q, **qtail;              /* frames sent before the handshake ended */
  uint8_t *stash;                  /* bytes read past a header being parsed off the loop */
  size_t stash_len;
  int parsing;                     /* a header is being parsed in the thread pool: reading stopped */
  int parsed_later;                /* the frame about to be handled had such a header: freed there too */
  size_t qbytes;

  uv_tcp_t tcp;
  int tcp_open, tcp_closing;
  uv_getaddrinfo_t gai;
  int gai_active;
  uv_connect_t conn;
  uv_shutdown_t shut;
  int linger;                      /* flush what is queued (a refusal) before closing */
  uv_timer_t retry;
  int retry_open;
  unsigned handles;                /* open handles and requests; freed at 0 once closing */
  char last_err[160];              /* why the last connect attempt failed */

  int lost_code, notify, ever_ready;
  char lost_why[384];
  sd_peer *prev, *next;
};

struct sd_peer_net {
  uv_loop_t *loop;
  sd_peer_handlers h;
  void *ud;
  char node[SD_PEER_NAME_MAX + 1];
  uint8_t *token;
  size_t token_len;
  uint64_t timeout_ms;
  char listen_host[SD_PEER_ADDR_MAX];
  unsigned listen_port;
  char listen_addr[SD_PEER_ADDR_MAX];
  sd_acceptor listener;    /* acceptor.c: EMFILE never drops connections unlogged */
  unsigned fd_reserve;     /* descriptors an incoming peer may not eat into */
  int listening;
  uv_timer_t hb;
  uv_timer_t hs;           /* handshake deadlines, and the count of suppressed lines */
  uint64_t handshake_ms;
  unsigned max_unauth, nunauth;
  sd_log_limit strangers;  /* lines strangers cause: at most one a second */
  uint64_t hb_last;        /* when the heartbeat timer last ran, to notice a stalled loop */
  unsigned handles;
  int closing;
  sd_peer *peers;
  unsigned npeers;
  uint64_t next_id, bytes_tx, bytes_rx;
  uint8_t rbuf[READ_BUF];
};

static inline uint64_t now_ms(const sd_peer_net *net) { return uv_now(net->loop); }

/* peer_names.c */
/* How logs name a connection (a static buffer). */
const char *sd_peer_who(const sd_peer *p);
void sd_peer_sockaddr_str(const struct sockaddr *sa, char *out, size_t n);
/* A line a stranger caused: at most one a second, with the count of those held back. */
void sd_peer_log_stranger(sd_peer_net *net, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What this daemon tells a peer it dials: where others reach its listener ("" without one); a
 * wildcard bind announces the local address of p's connection. */
void sd_peer_announced_listen(const sd_peer *p, char *out, size_t n);

/* peer_parse.c */
typedef void (*sd_peer_parsed_cb)(void *ud, int rc, const sd_error *err);
/* Parses the header r's feed left pending (SD_FRAME_PARSE_PENDING) in the thread pool; done runs
 * on the loop with sd_frame_parse_header's result. r must stay until then. 0, or -1 when nothing
 * could be queued (no callback then). */
int sd_peer_parse_off_loop(uv_loop_t *loop, sd_frame_reader *r, sd_peer_parsed_cb done, void *ud);
/* Drops a reference to a large header in the thread pool (freeing millions of values takes a while). */
void sd_peer_free_later(uv_loop_t *loop, json_t *h);

/* peer_conn.c */
/* Closes with a reason for on_lost (not logged); frees at once when no handle is open. */
void sd_peer_fail(sd_peer *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A new connection in the net's list; NULL past the cap on outgoing and authenticated ones. */
sd_peer *sd_peer_new_conn(sd_peer_net *net, int outgoing);
void sd_peer_start_reading(sd_peer *p);
/* Frees the net once it is closing and no handle or connection is left. */
void sd_peer_net_maybe_free(sd_peer_net *net);

/* peer_strangers.c */
/* The listener's connection callback. */
void sd_peer_on_incoming(void *ud, int fd);
/* The timer closing connections past peer_handshake_timeout. */
void sd_peer_on_handshake_tick(uv_timer_t *t);

#endif
