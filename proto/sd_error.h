/* Internal error carrier: a stable code from shardd.h plus a message naming the culprit. */
#ifndef SD_ERROR_H
#define SD_ERROR_H

#include <stdarg.h>
#include "shardd/shardd.h"

#define SD_ERRMSG_MAX 512

typedef struct {
  int code;                 /* 0 or a SHARDD_E_* value */
  char msg[SD_ERRMSG_MAX];  /* names the field, tensor, box or file at fault */
} sd_error;

/* Records code and a printf-style message in err (which may be NULL) and
 * returns code, so callers can write `return sd_fail(err, ...)`. */
int sd_fail(sd_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int sd_vfail(sd_error *err, int code, const char *fmt, va_list ap);
void sd_error_clear(sd_error *err);

const char *sd_err_name(int code);     /* "gap", ...; "unknown" */
const char *sd_err_message(int code);  /* "slices leave a gap", ... */
int sd_err_from_name(const char *name);

/* The one map from a failed call's errno to a code, so that every writer, opener and mapper reports a full
 * disk, a quota, a refusal or a shortage alike; anything else (0 included: a call that failed without saying
 * why) is SHARDD_E_IO. Path-resolution errnos keep their own meaning in pathsafe.c. */
int sd_err_from_errno(int e);

#endif
