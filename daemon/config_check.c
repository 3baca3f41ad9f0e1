/* Daemon settings held against the system (groups, listen addresses), and where each one came from, for the messages. */
#include <grp.h>
#include <stdio.h>
#include <string.h>

#include "config_check.h"
#include "config_int.h"
#include "peer_auth.h"

void sd_config_flag_name(const sd_config_key *k, char *buf, size_t n) {
  snprintf(buf, n, "%s", k->name);
  for (char *p = buf; *p; p++)
    if (*p == '_') *p = '-';
}

/* Where key k's value came from, for messages: the option, the file line, or the default. */
void sd_config_where(const sd_config *c, const struct sd_config_src *src, const unsigned *lines,
                     const sd_config_key *k, char *buf, size_t n) {
  size_t ki = (size_t)(k - sd_config_keys);
  for (size_t i = src ? src->ncli : 0; i-- > 0;) {
    if (src->cli[i].key == ki) {
      char flag[64];
      sd_config_flag_name(k, flag, sizeof flag);
      snprintf(buf, n, "option --%s", flag);
      return;
    }
  }
  if (lines && lines[ki] && c->config_path)
    snprintf(buf, n, "%s:%u: key '%s'", c->config_path, lines[ki], k->name);
  else
    snprintf(buf, n, "key '%s' (default)", k->name);
}

/* A group key (name or number) to its gid; -1 when empty. */
static int resolve_group(sd_config *c, const unsigned *lines, const char *key, const char *value, long *out,
                         sd_error *err) {
  *out = -1;
  if (!value || !*value) return 0;
  unsigned long long gid = 0;
  const char *end = NULL;
  if (sd_config_digits(value, 10, &gid, &end) == 0 && !*end && gid < (1ULL << 31)) {
    *out = (long)gid;
    return 0;
  }
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(value, &gr, buf, sizeof buf, &res) == 0 && res) {
    *out = (long)res->gr_gid;
    return 0;
  }
  char w[512];
  sd_config_where(c, c->src, lines, sd_config_find_key(key), w, sizeof w);
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s: no group named '%.100s'", w, value);
}

/* An ADDR:PORT key's shape, so --check-config catches it (binding is at start). */
static int check_addr(sd_config *c, const unsigned *lines, const char *key, const char *value, sd_error *err) {
  char host[256], w[512];
  unsigned port;
  sd_error e = {0};
  if (!*value || sd_peer_addr_split(value, host, sizeof host, &port, &e) == 0) return 0;
  sd_config_where(c, c->src, lines, sd_config_find_key(key), w, sizeof w);
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s: must be HOST:PORT or [IPV6]:PORT, the port 0 to 65535, got '%.100s'",
                 w, value);
}

int sd_config_check(sd_config *c, const unsigned *lines, sd_error *err) {
  int rc = resolve_group(c, lines, "socket_group", c->socket_group, &c->socket_gid, err);
  if (!rc) rc = resolve_group(c, lines, "trusted_group", c->trusted_group, &c->trusted_gid, err);
  if (!rc) rc = check_addr(c, lines, "peer_listen", c->peer_listen, err);
  return rc ? rc : check_addr(c, lines, "metrics_listen", c->metrics_listen, err);
}
