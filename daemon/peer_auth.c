/* Peer authentication: HMAC-SHA256 proofs over fresh nonces (OpenSSL libcrypto), token file, addresses. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer_auth.h"

#define PROOF_LABEL "shardd-peer-v2"

/* ------------------------------------------------------------------------ *
 * The hello
 * ------------------------------------------------------------------------ */
int sd_peer_hello_parse(const json_t *h, sd_peer_hello *out, sd_error *err) {
  memset(out, 0, sizeof *out);
  json_t *v = json_object_get(h, "v");
  if (!json_is_integer(v) || json_integer_value(v) != SD_PEER_PROTO) {
    char got[32] = "none";
    if (json_is_integer(v)) snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
    return sd_fail(err, SHARDD_E_UNSUPPORTED_PROTO,
                   "peer protocol version %s is not supported (this daemon speaks %d)", got, SD_PEER_PROTO);
  }
  const char *name = json_string_value(json_object_get(h, "node"));
  const char *nonce = json_string_value(json_object_get(h, "nonce"));
  if (!name || !*name || strlen(name) > SD_PEER_NAME_MAX || !nonce ||
      sd_peer_unhex(nonce, out->nonce, SD_PEER_NONCE_LEN) != 0)
    return sd_fail(err, SHARDD_E_PROTOCOL, "malformed hello (node name or nonce)");
  snprintf(out->name, sizeof out->name, "%s", name);
  const char *listen = json_string_value(json_object_get(h, "listen"));
  if (listen && strlen(listen) < sizeof out->listen) snprintf(out->listen, sizeof out->listen, "%s", listen);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Proofs
 * ------------------------------------------------------------------------ */
/* A name with its length in front, so no two pairs of names make the same bytes. */
static size_t put_name(uint8_t *msg, const char *name) {
  size_t l = strlen(name);
  msg[0] = (uint8_t)(l >> 8);
  msg[1] = (uint8_t)l;
  memcpy(msg + 2, name, l);
  return 2 + l;
}

int sd_peer_proof(const uint8_t *token, size_t token_len, const char *role, const sd_peer_transcript *t,
                  uint8_t out[SD_PEER_MAC_LEN]) {
  /* The prover's role, then the connection as both sides saw it, in one order whoever computes it:
   * a proof is worth nothing in the other direction, on another connection, or between other names. */
  uint8_t msg[sizeof PROOF_LABEL - 1 + 17 + 2 * SD_PEER_NONCE_LEN + 2 * (2 + SD_PEER_NAME_MAX)];
  size_t rl = strlen(role), n = 0;
  if (rl > 16 || !token || token_len == 0 || token_len > SD_PEER_TOKEN_MAX || !t->connector || !t->acceptor ||
      strlen(t->connector) > SD_PEER_NAME_MAX || strlen(t->acceptor) > SD_PEER_NAME_MAX)
    return -1;
  memcpy(msg + n, PROOF_LABEL, sizeof PROOF_LABEL - 1);
  n += sizeof PROOF_LABEL - 1;
  memcpy(msg + n, role, rl + 1); /* with its NUL */
  n += rl + 1;
  memcpy(msg + n, t->connector_nonce, SD_PEER_NONCE_LEN);
  n += SD_PEER_NONCE_LEN;
  memcpy(msg + n, t->acceptor_nonce, SD_PEER_NONCE_LEN);
  n += SD_PEER_NONCE_LEN;
  n += put_name(msg + n, t->connector);
  n += put_name(msg + n, t->acceptor);
  unsigned mlen = 0;
  if (!HMAC(EVP_sha256(), token, (int)token_len, msg, n, out, &mlen) || mlen != SD_PEER_MAC_LEN) return -1;
  return 0;
}

int sd_peer_proof_check(const uint8_t *token, size_t token_len, const char *role, const sd_peer_transcript *t,
                        const char *proof_hex) {
  uint8_t want[SD_PEER_MAC_LEN], got[SD_PEER_MAC_LEN];
  if (!proof_hex || strlen(proof_hex) != 2 * SD_PEER_MAC_LEN) return 0;
  if (sd_peer_unhex(proof_hex, got, sizeof got) != 0) return 0;
  if (sd_peer_proof(token, token_len, role, t, want) != 0) return 0;
  int ok = CRYPTO_memcmp(want, got, sizeof want) == 0;
  OPENSSL_cleanse(want, sizeof want);
  return ok;
}

int sd_peer_random(uint8_t *buf, size_t n) {
  return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}

void sd_peer_hex(const uint8_t *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int sd_peer_unhex(const char *hex, uint8_t *out, size_t n) {
  if (!hex || strlen(hex) != 2 * n) return -1;
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

/* ------------------------------------------------------------------------ *
 * The token file
 * ------------------------------------------------------------------------ */
int sd_peer_token_load(const char *path, uint8_t **token, size_t *len, sd_error *err) {
  *token = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "cannot open peer token file '%s': %s", path,
                   strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "peer token file '%s' is not a regular file", path);
  }
  /* A secret others can read is no secret: refuse rather than warn. */
  if (st.st_mode & 0077) {
    close(fd);
    return sd_fail(err, SHARDD_E_PERMISSION,
                   "peer token file '%s' has mode %03o; it must not be readable by group or others "
                   "(chmod 600)", path, (unsigned)(st.st_mode & 0777));
  }
  uint8_t *buf = malloc(SD_PEER_TOKEN_MAX + 2);
  if (!buf) {
    close(fd);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory reading the peer token");
  }
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, SD_PEER_TOKEN_MAX + 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      free(buf);
      return sd_fail(err, SHARDD_E_IO, "cannot read peer token file '%s': %s", path, strerror(e));
    }
    if (r == 0) break;
    n += (size_t)r;
    if (n > SD_PEER_TOKEN_MAX) break;
  }
  close(fd);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
    n--;
  if (n < SD_PEER_TOKEN_MIN || n > SD_PEER_TOKEN_MAX) {
    OPENSSL_cleanse(buf, SD_PEER_TOKEN_MAX + 2);
    free(buf);
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "peer token in '%s' must be %d to %d bytes (e.g. `openssl rand -hex 32`)", path,
                   SD_PEER_TOKEN_MIN, SD_PEER_TOKEN_MAX);
  }
  *token = buf;
  *len = n;
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Addresses
 * ------------------------------------------------------------------------ */
int sd_peer_addr_split(const char *addr, char *host, size_t hostlen, unsigned *port, sd_error *err) {
  if (!addr || !*addr || strlen(addr) >= SD_PEER_ADDR_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "peer address must be HOST:PORT, got '%.100s'",
                   addr ? addr : "");
  const char *hs = addr, *he, *colon;
  if (addr[0] == '[') {
    const char *rb = strchr(addr, ']');
    if (!rb || rb[1] != ':')
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "peer address '%s': expected [IPV6]:PORT", addr);
    hs = addr + 1;
    he = rb;
    colon = rb + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon || strchr(addr, ':') != colon)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "peer address '%s' must be HOST:PORT (an IPv6 address goes in brackets)", addr);
    he = colon;
  }
  size_t hl = (size_t)(he - hs);
  if (hl == 0 || hl >= hostlen)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "peer address '%s' has no host", addr);
  const char *ps = colon + 1;
  char *end = NULL;
  errno = 0;
  unsigned long p = strtoul(ps, &end, 10);
  if (!*ps || *end || errno || p > 65535 || ps[0] == '-' || ps[0] == '+')
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "peer address '%s': port must be 0 to 65535", addr);
  memcpy(host, hs, hl);
  host[hl] = '\0';
  *port = (unsigned)p;
  return 0;
}
