/* Peer login (peer_auth.c): the wire constants, HMAC-SHA256 proofs, the shared token, hello parsing, addresses. */
#ifndef SD_PEER_AUTH_H
#define SD_PEER_AUTH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * Wire constants (proto/PEERS.md)
 * ------------------------------------------------------------------------ */
/* 2: the proofs bind the direction, both nonces and both node names (v1's did not: reflectable).
 * 3: manifests in chunks of numbers with the tensor table sent once, by digest (v2's were one JSON
 * frame a node): a v2 node's manifest would read as malformed, so the handshake refuses it first. */
#define SD_PEER_PROTO 3
#define SD_PEER_NONCE_LEN 32
#define SD_PEER_MAC_LEN 32
#define SD_PEER_TOKEN_MIN 16             /* bytes in the shared secret */
#define SD_PEER_TOKEN_MAX 4096
#define SD_PEER_ADDR_MAX 300             /* "host:port" */
#define SD_PEER_NAME_MAX 128             /* node names */

/* ------------------------------------------------------------------------ *
 * Authentication (peer_auth.c): pure, so criterion checks it directly
 * ------------------------------------------------------------------------ */
/* What one connection's proofs are bound to: who dialled whom, by name, and both fresh nonces. */
typedef struct {
  const char *connector, *acceptor;          /* node names as each hello gave them */
  const uint8_t *connector_nonce, *acceptor_nonce; /* SD_PEER_NONCE_LEN bytes each */
} sd_peer_transcript;
/* HMAC-SHA256(token, "shardd-peer-v2" || role || 0 || Nc || Na || len16 || connector || len16 ||
 * acceptor); role ("connector" or "acceptor") is the prover's, so a proof never serves the other
 * side, nor another connection (other nonces) nor another pair of names (a reflection: the
 * daemon would have to be both ends). */
int sd_peer_proof(const uint8_t *token, size_t token_len, const char *role, const sd_peer_transcript *t,
                  uint8_t out[SD_PEER_MAC_LEN]);
/* 1 when `proof` (hex, from the wire) is the proof the peer in `role` owes us on this transcript;
 * compared in constant time. */
int sd_peer_proof_check(const uint8_t *token, size_t token_len, const char *role, const sd_peer_transcript *t,
                        const char *proof_hex);
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

#endif
