/* Peer connections before login: accepting, the cap on strangers with fair eviction, the handshake deadline, rate-limited logs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "peer.h"
#include "peer_int.h"

/* A refused connection is closed at once, so it does not sit in the backlog. */
static void drop_incoming(sd_peer_net *net, int fd, const char *why) {
  char remote[SD_PEER_ADDR_MAX] = "?";
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) sd_peer_sockaddr_str((struct sockaddr *)&ss, remote, sizeof remote);
  close(fd);
  sd_peer_log_stranger(net, "refusing a peer connection from %s: %s", remote, why);
}

/* Which network a connection comes from: an IPv4 address, or an IPv6 /64 (what one host
 * usually holds); a v4-mapped IPv6 address counts as the IPv4 one. */
static uint64_t source_of(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET) return 1ull << 32 | ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr);
  if (ss->ss_family != AF_INET6) return 0;
  const uint8_t *a = ((const struct sockaddr_in6 *)ss)->sin6_addr.s6_addr;
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(a, mapped, sizeof mapped) == 0)
    return 1ull << 32 | (uint64_t)a[12] << 24 | (uint64_t)a[13] << 16 | (uint64_t)a[14] << 8 | a[15];
  uint64_t k = 0;
  for (int i = 0; i < 8; i++) k = k << 8 | a[i];
  return k | 1; /* never 0, never an IPv4 key's exact form in practice */
}

/* The source holding the most connections that have not logged in (a small open-addressed
 * count, rebuilt per eviction: max_unauth entries at most). 0 when it cannot tell. */
static uint64_t busiest_source(const sd_peer_net *net) {
  size_t cap = 16;
  while (cap < 2 * (size_t)net->nunauth) cap *= 2;
  struct {
    uint64_t key;
    unsigned n;
  } *tab = calloc(cap, sizeof *tab);
  if (!tab) return 0;
  uint64_t best = 0;
  unsigned most = 0;
  for (const sd_peer *p = net->peers; p; p = p->next) {
    if (!p->unauth) continue;
    size_t i = (size_t)(p->source * 0x9e3779b97f4a7c15ull >> 40) & (cap - 1);
    while (tab[i].n && tab[i].key != p->source) i = (i + 1) & (cap - 1);
    tab[i].key = p->source;
    if (++tab[i].n >= most) { /* ties go to the source seen later: the older connection */
      most = tab[i].n;
      best = p->source;
    }
  }
  free(tab);
  return best;
}

/* Strangers beyond max_unauth push out the oldest connection of the source that holds the most
 * slots. A flood from one host (or one IPv6 /64) then only rotates through its own connections,
 * and a real peer from elsewhere keeps its slot for its round trip or two of handshake. */
static void evict_stranger(sd_peer_net *net) {
  uint64_t source = busiest_source(net);
  sd_peer *oldest = NULL;
  for (sd_peer *p = net->peers; p; p = p->next)
    if (p->unauth && (!source || p->source == source)) oldest = p; /* new peers go to the head */
  if (!oldest) return;
  sd_peer_log_stranger(net, "peer connection from %s: closed to make room: %u connections have not logged in "
               "(peer_max_unauth)", sd_peer_who(oldest), net->nunauth);
  sd_peer_fail(oldest, SHARDD_E_LIMIT, "too many peer connections that have not logged in");
}

void sd_peer_on_incoming(void *ud, int fd) {
  sd_peer_net *net = ud;
  if (net->fd_reserve && sd_fd_over_budget(fd, net->fd_reserve)) {
    drop_incoming(net, fd, "too many open descriptors (fd_reserve is kept for the writer and local clients)");
    return;
  }
  if (net->npeers - net->nunauth >= MAX_PEERS) {
    drop_incoming(net, fd, "too many peers");
    return;
  }
  sd_peer *p = sd_peer_new_conn(net, 0);
  if (!p) {
    drop_incoming(net, fd, "out of memory");
    return;
  }
  uv_tcp_init(net->loop, &p->tcp);
  p->tcp.data = p;
  p->tcp_open = 1;
  p->handles++;
  if (uv_tcp_open(&p->tcp, fd) != 0) {
    close(fd);
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "accept failed");
    return;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  memset(&ss, 0, sizeof ss);
  if (uv_tcp_getpeername(&p->tcp, (struct sockaddr *)&ss, &len) == 0)
    sd_peer_sockaddr_str((struct sockaddr *)&ss, p->remote, sizeof p->remote);
  p->source = source_of(&ss);
  /* Counted among strangers once its source is known, so the eviction can weigh it too. */
  p->unauth = 1;
  net->nunauth++;
  if (net->nunauth > net->max_unauth) evict_stranger(net);
  sd_log_debug("peer connection from %s", p->remote);
  p->state = P_HELLO_WAIT;
  p->hs_deadline = now_ms(net) + net->handshake_ms;
  sd_peer_start_reading(p);
}

/* Connections still in their handshake past peer_handshake_timeout are closed, whatever they
 * trickle meanwhile; and the count of lines held back by the rate limit is not lost. */
void sd_peer_on_handshake_tick(uv_timer_t *t) {
  sd_peer_net *net = t->data;
  uint64_t now = now_ms(net);
  for (sd_peer *p = net->peers, *next; p; p = next) {
    next = p->next;
    if (p->state != P_HELLO_WAIT && p->state != P_AUTH_WAIT) continue;
    if (!p->hs_deadline || now < p->hs_deadline) continue;
    if (p->unauth)
      sd_peer_log_stranger(net, "peer connection from %s: no login within %.1f s (peer_handshake_timeout); closing it",
                   sd_peer_who(p), (double)net->handshake_ms / 1000.0);
    else
      sd_log_warn("peer %s: the handshake did not end within %.1f s (peer_handshake_timeout)", sd_peer_who(p),
                  (double)net->handshake_ms / 1000.0);
    sd_peer_fail(p, SHARDD_E_PEER_LOST, "%s did not complete the handshake within %.1f s", sd_peer_who(p),
              (double)net->handshake_ms / 1000.0);
  }
  /* Only after a quiet spell: while a flood goes on its own next line carries the count. */
  if (net->strangers.suppressed && now >= net->strangers.last_ms + 2000) {
    sd_log_warn("%u more lines about unauthenticated peer connections suppressed", net->strangers.suppressed);
    net->strangers.suppressed = 0;
    net->strangers.last_ms = now;
  }
}

