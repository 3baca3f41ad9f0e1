/* Names of peer connections: how logs name them (only what a connection proved is believed), the limit on lines strangers cause, and the listener address this daemon announces. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "sd_escape.h"

void sd_peer_sockaddr_str(const struct sockaddr *sa, char *out, size_t n) {
  char ip[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    uv_ip4_name(s4, ip, sizeof ip);
    port = ntohs(s4->sin_port);
    snprintf(out, n, "%s:%u", ip, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(s6, ip, sizeof ip);
    port = ntohs(s6->sin6_port);
    snprintf(out, n, "[%s]:%u", ip, port);
  } else {
    snprintf(out, n, "?");
  }
}

/* How logs name a connection. Until an incoming peer proves it holds the token, what it claims
 * (its name, its listener) is not believed: it is named by the socket's far end. */
const char *sd_peer_who(const sd_peer *p) {
  static char buf[4 * SD_ESCAPE_BUF];
  sd_escbuf name, addr;
  const char *remote = p->remote[0] ? p->remote : "?";
  if (!p->outgoing && !p->ever_ready)
    snprintf(buf, sizeof buf, "%s", remote);
  else if (!p->outgoing)
    snprintf(buf, sizeof buf, "'%s' at %s (from %s)", sd_esc(&name, p->name),
             sd_esc(&addr, p->addr[0] ? p->addr : "?"), remote);
  else if (p->name[0] && p->ever_ready)
    snprintf(buf, sizeof buf, "'%s' at %s", sd_esc(&name, p->name), p->addr);
  else
    snprintf(buf, sizeof buf, "%s", p->addr);
  return buf;
}

/* A line a stranger caused: at most one a second, with the count of those held back. */
void sd_peer_log_stranger(sd_peer_net *net, const char *fmt, ...) {
  unsigned held = 0;
  if (!sd_log_limit_ok(&net->strangers, now_ms(net), &held)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (held)
    sd_log_warn("%s (%u similar lines about unauthenticated peer connections suppressed)", msg, held);
  else
    sd_log_warn("%s", msg);
}

/* What we tell a peer we connect to: where others reach our listener. A
 * wildcard bind announces the local address this connection leaves from. */
void sd_peer_announced_listen(const sd_peer *p, char *out, size_t n) {
  sd_peer_net *net = p->net;
  out[0] = '\0';
  if (!net->listening) return;
  const char *h = net->listen_host;
  if (strcmp(h, "0.0.0.0") && strcmp(h, "::") && strcmp(h, "")) {
    snprintf(out, n, "%s", net->listen_addr);
    return;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getsockname((uv_tcp_t *)&p->tcp, (struct sockaddr *)&ss, &len) != 0) return;
  char ip[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
    snprintf(out, n, "%s:%u", ip, net->listen_port);
  } else {
    uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
    snprintf(out, n, "[%s]:%u", ip, net->listen_port);
  }
}
