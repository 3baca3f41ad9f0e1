/* Protocol v1 message codec: request parsing, typed field access with errors naming the field, reply builders. */
#ifndef SD_MSG_H
#define SD_MSG_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "sd_error.h"
#include "sd_format.h"

/* Largest integer a JSON number carries exactly in every common parser
 * (IEEE double): integer fields are limited to it. */
#define SD_MSG_INT_MAX (1ULL << 53)

/* ------------------------------------------------------------------------ *
 * Requests
 * ------------------------------------------------------------------------ */
/* One line -> one JSON object (duplicate keys, invalid UTF-8 and NUL refused).
 * SHARDD_E_BAD_REQUEST with the parser's reason otherwise. */
int sd_msg_parse(const char *line, size_t len, json_t **out, sd_error *err);
/* The "op" string of a request; SHARDD_E_BAD_REQUEST when missing or not a string. */
int sd_msg_op(const json_t *req, const char **op, sd_error *err);

/* Field getters. Each returns 1 when the field is present and valid, 0 when
 * it is absent or null and not required (outputs untouched), or
 * SHARDD_E_INVALID_ARGUMENT with a message naming the field. */
int sd_msg_str(const json_t *obj, const char *field, int required, const char **out, size_t *len,
               sd_error *err);
/* A non-negative integer <= max (max 0 means SD_MSG_INT_MAX). A number
 * written with a fraction or exponent is accepted only when it is integral. */
int sd_msg_u64(const json_t *obj, const char *field, int required, uint64_t max, uint64_t *out,
               sd_error *err);
int sd_msg_bool(const json_t *obj, const char *field, int required, int *out, sd_error *err);
/* An array of at most max_n integers, each <= max (0: SD_MSG_INT_MAX). */
int sd_msg_u64_array(const json_t *obj, const char *field, int required, size_t max_n,
                     uint64_t max, uint64_t *out, size_t *n, sd_error *err);
/* An object whose values are all strings. *out is a malloc'd array (free it)
 * whose strings point into obj, so obj must outlive it. */
int sd_msg_str_map(const json_t *obj, const char *field, int required, size_t max_n, sd_kv **out,
                   size_t *n, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Replies and events. `id` is borrowed (NULL encodes as null).
 * ------------------------------------------------------------------------ */
json_t *sd_msg_ok(json_t *id);
json_t *sd_msg_error(json_t *id, int code, const char *message);
json_t *sd_msg_error_from(json_t *id, const sd_error *err);
json_t *sd_msg_event(const char *event, const char *save);
/* A JSON string from bytes that may hold invalid UTF-8 (replaced by '?'),
 * e.g. a message truncated in the middle of a character. */
json_t *sd_msg_string_lossy(const char *s);
/* Compact encoding plus '\n' (and a NUL not counted in *len), malloc'd;
 * NULL when out of memory. */
char *sd_msg_dump(const json_t *msg, size_t *len);

#endif
