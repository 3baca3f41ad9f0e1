/* The peer network: its listener, heartbeats and handshake timer, started and closed, above the connections (peer_conn.c) and strangers (peer_strangers.c). */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "peer.h"
#include "peer_int.h"

/* ------------------------------------------------------------------------ *
 * Listening
 * ------------------------------------------------------------------------ */
static void on_listener_stopped(void *ud) {
  sd_peer_net *net = ud;
  net->handles--;
  sd_peer_net_maybe_free(net);
}

static int listen_open(sd_peer_net *net, const char *addr, sd_error *err) {
  unsigned port;
  int rc = sd_peer_addr_split(addr, net->listen_host, sizeof net->listen_host, &port, err);
  if (rc) return rc;
  /* A plain socket for the acceptor: libuv's own accept would drop connections unlogged on EMFILE. */
  struct sockaddr_storage ss;
  const char *why = NULL;
  int fd = -1;
  rc = sd_tcp_listen(net->listen_host, port, 128, 1, &fd, &ss, &why);
  if (rc == 1) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "--peer-listen %s: %s", addr, why);
  if (rc < 0) return sd_fail(err, SHARDD_E_IO, "cannot listen for peers on %s: %s", addr, strerror(-rc));
  rc = sd_acceptor_start(&net->listener, net->loop, fd, "the peer listener", sd_peer_on_incoming, net);
  if (rc < 0) return sd_fail(err, SHARDD_E_IO, "cannot listen for peers on %s: %s", addr, uv_strerror(rc));
  net->listener.on_stopped = on_listener_stopped;
  net->handles++;
  net->listening = 1;
  sd_peer_sockaddr_str((struct sockaddr *)&ss, net->listen_addr, sizeof net->listen_addr);
  net->listen_port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                             : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Heartbeats: every timeout/3 a ping on every live connection; a peer
 * that sent nothing for the whole timeout is lost.
 * ------------------------------------------------------------------------ */
static void on_heartbeat(uv_timer_t *t) {
  sd_peer_net *net = t->data;
  uv_update_time(net->loop);
  uint64_t now = now_ms(net), every = net->timeout_ms / 3 ? net->timeout_ms / 3 : 1;
  /* Peers judge us by our pings: a loop stalled near the timeout costs saves. */
  if (net->hb_last && now - net->hb_last > 2 * every)
    sd_log_warn("peer heartbeats ran %.1f s late: the event loop was blocked", (double)(now - net->hb_last - every) / 1000.0);
  /* After our own stall, what peers sent meanwhile still waits unread in
   * the sockets (timers run before I/O): judge them on the next tick. */
  int judge = !net->hb_last || now - net->hb_last <= every + every / 2;
  net->hb_last = now;
  for (sd_peer *p = net->peers, *next; p; p = next) {
    next = p->next;
    if (p->state == P_CLOSING || p->state == P_RESOLVING || p->state == P_CONNECTING) continue;
    /* A frame of its being parsed (reading paused for it) is the latest sign of life. */
    if (p->parsing) p->last_rx = now;
    if (judge && now - p->last_rx > net->timeout_ms) {
      if (p->unauth)
        sd_peer_log_stranger(net, "peer connection from %s: nothing heard for %.1f s (--peer-timeout); dropping it",
                     sd_peer_who(p), (double)(now - p->last_rx) / 1000.0);
      else
        sd_log_warn("peer %s: nothing heard for %.1f s (--peer-timeout); dropping it", sd_peer_who(p),
                    (double)(now - p->last_rx) / 1000.0);
      sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s went silent for more than %.1f s", sd_peer_who(p),
                (double)net->timeout_ms / 1000.0);
      continue;
    }
    if (p->state == P_READY) sd_peer_send(p, json_pack("{s:s}", "t", "ping"), NULL, 0);
  }
}

/* ------------------------------------------------------------------------ *
 * The net
 * ------------------------------------------------------------------------ */
int sd_peer_net_init(sd_peer_net **out, uv_loop_t *loop, const sd_peer_opts *o, const sd_peer_handlers *h,
                     void *ud, sd_error *err) {
  *out = NULL;
  sd_peer_net *net = calloc(1, sizeof *net);
  if (!net) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for the peer network");
  net->loop = loop;
  net->h = *h;
  net->ud = ud;
  snprintf(net->node, sizeof net->node, "%s", o->node_name ? o->node_name : "node");
  net->token = malloc(o->token_len ? o->token_len : 1);
  if (!net->token) {
    free(net);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for the peer network");
  }
  memcpy(net->token, o->token, o->token_len);
  net->token_len = o->token_len;
  net->timeout_ms = o->timeout_ms ? o->timeout_ms : 30000;
  uv_timer_init(loop, &net->hb);
  net->hb.data = net;
  net->handles++;
  uint64_t every = net->timeout_ms / 3 ? net->timeout_ms / 3 : 1;
  uv_timer_start(&net->hb, on_heartbeat, every, every);
  /* Heartbeats alone must not keep a stopping daemon alive. */
  uv_unref((uv_handle_t *)&net->hb);
  net->handshake_ms = o->handshake_ms ? o->handshake_ms : net->timeout_ms;
  net->max_unauth = o->max_unauth ? o->max_unauth : 64;
  net->fd_reserve = o->fd_reserve;
  uint64_t tick = net->handshake_ms / 4 > HANDSHAKE_TICK_MIN ? net->handshake_ms / 4 : HANDSHAKE_TICK_MIN;
  if (tick > 1000) tick = 1000; /* also flushes the count of suppressed lines soon after a flood */
  uv_timer_init(loop, &net->hs);
  net->hs.data = net;
  net->handles++;
  uv_timer_start(&net->hs, sd_peer_on_handshake_tick, tick, tick);
  uv_unref((uv_handle_t *)&net->hs);
  *out = net;
  if (o->listen) {
    int rc = listen_open(net, o->listen, err);
    if (rc) {
      sd_peer_net_close(net);
      *out = NULL;
      return rc;
    }
  }
  return 0;
}

static void on_net_handle_closed(uv_handle_t *h) {
  sd_peer_net *net = h->data;
  net->handles--;
  sd_peer_net_maybe_free(net);
}

void sd_peer_net_close(sd_peer_net *net) {
  if (!net || net->closing) return;
  net->closing = 1;
  for (sd_peer *p = net->peers, *next; p; p = next) {
    next = p->next;
    p->notify = 0;
    sd_peer_fail(p, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  }
  if (net->listening) sd_acceptor_stop(&net->listener);
  uv_close((uv_handle_t *)&net->hb, on_net_handle_closed);
  uv_close((uv_handle_t *)&net->hs, on_net_handle_closed);
}

void *sd_peer_net_ud(const sd_peer_net *net) { return net->ud; }
const char *sd_peer_net_listen_addr(const sd_peer_net *net) { return net->listen_addr; }
const char *sd_peer_net_node(const sd_peer_net *net) { return net->node; }
uint64_t sd_peer_net_timeout(const sd_peer_net *net) { return net->timeout_ms; }
unsigned sd_peer_net_count(const sd_peer_net *net) { return net->npeers; }
unsigned sd_peer_net_unauth_count(const sd_peer_net *net) { return net->nunauth; }
uint64_t sd_peer_net_bytes_sent(const sd_peer_net *net) { return net->bytes_tx; }
uint64_t sd_peer_net_bytes_received(const sd_peer_net *net) { return net->bytes_rx; }
