/* Error code tables shared by daemon, client and tools. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "sd_error.h"

int sd_vfail(sd_error *err, int code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  }
  return code;
}

int sd_fail(sd_error *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sd_vfail(err, code, fmt, ap);
  va_end(ap);
  return code;
}

void sd_error_clear(sd_error *err) {
  if (err) {
    err->code = 0;
    err->msg[0] = '\0';
  }
}

const char *sd_err_name(int code) {
  switch (code) {
    case 0: return "ok";
#define XX(name, num, wire, text) case SHARDD_E_##name: return wire;
    SHARDD_ERRNO_MAP(XX)
#undef XX
    default: return "unknown";
  }
}

const char *sd_err_message(int code) {
  switch (code) {
    case 0: return "success";
#define XX(name, num, wire, text) case SHARDD_E_##name: return text;
    SHARDD_ERRNO_MAP(XX)
#undef XX
    default: return "unknown error";
  }
}

int sd_err_from_name(const char *name) {
  if (!name) return SHARDD_E_PROTOCOL;
  if (strcmp(name, "ok") == 0) return 0;
#define XX(name_, num, wire, text) if (strcmp(name, wire) == 0) return SHARDD_E_##name_;
  SHARDD_ERRNO_MAP(XX)
#undef XX
  return SHARDD_E_PROTOCOL;
}

int sd_err_from_errno(int e) {
  switch (e) {
    case ENOSPC:
    case EDQUOT: return SHARDD_E_NO_SPACE;
    case ENOMEM:
    case ENOBUFS: return SHARDD_E_NO_MEMORY;
    case EACCES:
    case EPERM: return SHARDD_E_PERMISSION;
    default: return SHARDD_E_IO;
  }
}
