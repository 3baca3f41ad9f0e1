/* Protocol v1 message codec: request parsing, typed field access, reply builders. */
#include <stdlib.h>
#include <string.h>

#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * Requests
 * ------------------------------------------------------------------------ */
int sd_msg_parse(const char *line, size_t len, json_t **out, sd_error *err) {
  json_error_t je;
  *out = NULL;
  json_t *v = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
  if (!v) return sd_fail(err, SHARDD_E_BAD_REQUEST, "invalid JSON at column %d: %s", je.column,
                         je.text);
  if (!json_is_object(v)) {
    json_decref(v);
    return sd_fail(err, SHARDD_E_BAD_REQUEST, "a request must be a JSON object");
  }
  *out = v;
  return 0;
}

int sd_msg_op(const json_t *req, const char **op, sd_error *err) {
  json_t *v = json_object_get(req, "op");
  if (!v) return sd_fail(err, SHARDD_E_BAD_REQUEST, "missing field 'op'");
  if (!json_is_string(v)) return sd_fail(err, SHARDD_E_BAD_REQUEST, "field 'op' must be a string");
  *op = json_string_value(v);
  return 0;
}

/* Absent and null mean the same: "use the default". */
static int lookup(const json_t *obj, const char *field, int required, json_t **v, sd_error *err) {
  *v = json_is_object(obj) ? json_object_get(obj, field) : NULL;
  if (*v && json_is_null(*v)) *v = NULL;
  if (!*v) return required ? sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "missing field '%s'", field) : 0;
  return 1;
}

int sd_msg_str(const json_t *obj, const char *field, int required, const char **out, size_t *len,
               sd_error *err) {
  json_t *v;
  int rc = lookup(obj, field, required, &v, err);
  if (rc <= 0) return rc;
  if (!json_is_string(v))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be a string", field);
  *out = json_string_value(v);
  if (len) *len = json_string_length(v);
  return 1;
}

/* Shared by scalar and array fields; `what` names the field in messages. */
static int number_u64(const json_t *v, const char *what, uint64_t max, uint64_t *out,
                      sd_error *err) {
  /* Above 2^53 a double no longer holds every integer, so comparisons and the
   * cast below would round: the wire never carries larger values. */
  if (max == 0 || max > SD_MSG_INT_MAX) max = SD_MSG_INT_MAX;
  if (json_is_integer(v)) {
    json_int_t i = json_integer_value(v);
    if (i < 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must not be negative", what);
    if ((uint64_t)i > max)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be at most %llu", what,
                     (unsigned long long)max);
    *out = (uint64_t)i;
    return 1;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (d < 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must not be negative", what);
    if (d > (double)max)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be at most %llu", what,
                     (unsigned long long)max);
    if (d != (double)(uint64_t)d)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be an integer", what);
    *out = (uint64_t)d;
    return 1;
  }
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be a non-negative integer", what);
}

int sd_msg_u64(const json_t *obj, const char *field, int required, uint64_t max, uint64_t *out,
               sd_error *err) {
  json_t *v;
  int rc = lookup(obj, field, required, &v, err);
  if (rc <= 0) return rc;
  return number_u64(v, field, max, out, err);
}

int sd_msg_bool(const json_t *obj, const char *field, int required, int *out, sd_error *err) {
  json_t *v;
  int rc = lookup(obj, field, required, &v, err);
  if (rc <= 0) return rc;
  if (!json_is_boolean(v))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be true or false", field);
  *out = json_is_true(v);
  return 1;
}

int sd_msg_u64_array(const json_t *obj, const char *field, int required, size_t max_n,
                     uint64_t max, uint64_t *out, size_t *n, sd_error *err) {
  json_t *v;
  int rc = lookup(obj, field, required, &v, err);
  if (rc <= 0) return rc;
  if (!json_is_array(v))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be an array of integers", field);
  size_t len = json_array_size(v);
  if (len > max_n)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' has %zu entries, at most %zu allowed",
                   field, len, max_n);
  for (size_t i = 0; i < len; i++) {
    char what[128];
    snprintf(what, sizeof what, "%.100s[%zu]", field, i);
    rc = number_u64(json_array_get(v, i), what, max, &out[i], err);
    if (rc < 0) return rc;
  }
  *n = len;
  return 1;
}

int sd_msg_str_map(const json_t *obj, const char *field, int required, size_t max_n, sd_kv **out,
                   size_t *n, sd_error *err) {
  json_t *v;
  int rc = lookup(obj, field, required, &v, err);
  if (rc <= 0) return rc;
  if (!json_is_object(v))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' must be an object of strings", field);
  size_t len = json_object_size(v);
  if (len > max_n)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s' has %zu entries, at most %zu allowed",
                   field, len, max_n);
  sd_kv *kv = calloc(len ? len : 1, sizeof *kv);
  if (!kv) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory reading field '%s'", field);
  const char *key;
  json_t *val;
  size_t i = 0;
  json_object_foreach(v, key, val) {
    if (!json_is_string(val)) {
      free(kv);
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field '%s.%.200s' must be a string", field, key);
    }
    kv[i].key = key;
    kv[i].value = json_string_value(val);
    i++;
  }
  *out = kv;
  *n = len;
  return 1;
}

/* ------------------------------------------------------------------------ *
 * Replies and events
 * ------------------------------------------------------------------------ */
/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return (s[1] & 0xc0) == 0x80 ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80) return 0;
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) return 0;
    return 4;
  }
  return 0;
}

json_t *sd_msg_string_lossy(const char *s) {
  if (!s) s = "";
  size_t n = strlen(s);
  char *copy = malloc(n + 1);
  if (!copy) return NULL;
  size_t i = 0;
  /* The NUL terminator stops every continuation check, so reads stay in bounds. */
  while (i < n) {
    size_t k = utf8_seq((const unsigned char *)s + i);
    if (k == 0) {
      copy[i++] = '?';
    } else {
      memcpy(copy + i, s + i, k);
      i += k;
    }
  }
  copy[n] = '\0';
  json_t *v = json_stringn(copy, n);
  free(copy);
  return v;
}

static json_t *reply(json_t *id, int ok) {
  json_t *r = json_object();
  if (!r) return NULL;
  json_object_set(r, "id", id ? id : json_null());
  json_object_set_new(r, "ok", json_boolean(ok));
  return r;
}

json_t *sd_msg_ok(json_t *id) { return reply(id, 1); }

json_t *sd_msg_error(json_t *id, int code, const char *message) {
  json_t *r = reply(id, 0);
  json_t *e = json_object();
  if (!r || !e) {
    json_decref(r);
    json_decref(e);
    return NULL;
  }
  json_object_set_new(e, "code", json_string(sd_err_name(code)));
  json_object_set_new(e, "message",
                      sd_msg_string_lossy(message && *message ? message : sd_err_message(code)));
  json_object_set_new(r, "error", e);
  return r;
}

json_t *sd_msg_error_from(json_t *id, const sd_error *err) {
  return sd_msg_error(id, err->code ? err->code : SHARDD_E_INTERNAL, err->msg);
}

json_t *sd_msg_event(const char *event, const char *save) {
  json_t *r = json_object();
  if (!r) return NULL;
  json_object_set_new(r, "event", json_string(event));
  if (save) json_object_set_new(r, "save", sd_msg_string_lossy(save));
  return r;
}

char *sd_msg_dump(const json_t *msg, size_t *len) {
  /* 17 significant digits, so every real (a client's "id" above all) reads back
   * as the same double it came in as; 0.1 goes out as 0.10000000000000001. */
  const size_t flags = JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
  size_t n = json_dumpb(msg, NULL, 0, flags);
  if (n == 0) return NULL;
  char *s = malloc(n + 2);
  if (!s) return NULL;
  if (json_dumpb(msg, s, n, flags) != n) {
    free(s);
    return NULL;
  }
  s[n] = '\n';
  s[n + 1] = '\0';
  if (len) *len = n + 1;
  return s;
}
