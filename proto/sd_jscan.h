/* A strict JSON text read in place (jscan.c): checked in one pass, then walked value by value without a tree. */
#ifndef SD_JSCAN_H
#define SD_JSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "sd_nameidx.h"

/* Checks that buf[0, len) is one JSON object or array and nothing else, as
 * strictly as jansson's loader without flags: UTF-8 only, no control
 * character or \u0000 in a string, no lone surrogate, integers within
 * int64, reals finite, at most 2048 levels deep. Duplicate keys are the
 * walker's to find: the keys it keeps in its own index, those of what it
 * walks past with sd_jcur_skip_unique. 0, or -1 with *at the
 * byte offset and *why the reason; *utf8 is 1 when the reason is bad UTF-8.
 * Memory: none beyond the stack. */
int sd_json_check(const char *buf, size_t len, size_t *at, const char **why, int *utf8);

/* A cursor over a text that sd_json_check accepted: nothing below can fail. */
typedef struct {
  const char *p, *end, *start;
} sd_jcur;

static inline void sd_jcur_init(sd_jcur *c, const char *buf, size_t len) {
  c->p = c->start = buf;
  c->end = buf + len;
}
/* The next value's first character after any whitespace: '{', '[', '"', 't', 'f', 'n', or a number's. */
char sd_jcur_peek(sd_jcur *c);
/* Past the '{' or '[' at the cursor. */
void sd_jcur_enter(sd_jcur *c);
/* In an object or array: 1 when another member follows (past its ','), 0 at the end (past the '}' or ']'). */
int sd_jcur_more(sd_jcur *c);
/* Bytes the string at the cursor decodes to at most (its raw length). */
size_t sd_jcur_strmax(sd_jcur *c);
/* Decodes the string at the cursor into out (room for sd_jcur_strmax + 1), NUL-terminated; its length. */
size_t sd_jcur_string(sd_jcur *c, char *out);
/* An object's key into a malloc'd string, past its ':'; NULL out of memory. */
char *sd_jcur_key(sd_jcur *c);
/* The number at the cursor: 1 with *v for an integer, 0 for a real (2.0, 1e3). */
int sd_jcur_number(sd_jcur *c, int64_t *v);
/* Past any value. */
void sd_jcur_skip(sd_jcur *c);
/* The keys of one object, each once, decoded into one buffer: what a walker keeps to find a
 * repeated key in linear time, with no allocation a key. All zero is an empty set. */
typedef struct {
  char *text;     /* the keys, each NUL-terminated */
  size_t len, tcap;
  size_t *at;     /* where each key begins in text */
  size_t n, acap;
  sd_nameidx idx; /* built once the object has more keys than a scan of them costs */
} sd_jkeys;
void sd_jkeys_init(sd_jkeys *s);
void sd_jkeys_free(sd_jkeys *s);
/* Reads the key at the cursor (an object's member: the cursor ends past its ':') into the set: 0
 * added, 1 a repeat (not added), -1 out of memory. *key is the key, valid until the next read. */
int sd_jkeys_read(sd_jkeys *s, sd_jcur *c, const char **key);
/* Past any value, refusing an object anywhere in it that repeats a key, as jansson's loader did
 * (JSON_REJECT_DUPLICATES) for entries a walker does not read itself: 0; 1 with *dup the repeated
 * key (malloc'd, the caller frees it) and *dup_at its offset; -1 out of memory. Time linear in the
 * value's bytes; memory the keys of the objects open at once, about their own bytes and 24 more each. */
int sd_jcur_skip_unique(sd_jcur *c, char **dup, size_t *dup_at);
/* The cursor's byte offset in the text, for messages. */
static inline size_t sd_jcur_at(const sd_jcur *c) { return (size_t)(c->p - c->start); }

#endif
