/* The safetensors dtypes shardd writes: whole-byte element types; sub-byte F4/F6 are refused. */
#include <string.h>

#include "sd_format.h"
#include "sd_utf8.h"

static const struct {
  const char *name;
  unsigned size;
} dtypes[SD_DT__COUNT] = {
#define SD_XX_(n, s) {#n, s},
    SD_DTYPE_MAP(SD_XX_)
#undef SD_XX_
};

/* Safetensors names for packed sub-byte types. Their byte size depends on the
 * whole tensor's bit count, which breaks per-element slicing into byte runs,
 * so they get a specific refusal rather than "unknown dtype". */
static const char *const subbyte[] = {"F4", "F6_E2M3", "F6_E3M2"};

int sd_dtype_parse(const char *s, sd_dtype *out, sd_error *err) {
  char shown[64];
  if (!s) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "dtype is missing");
  for (unsigned i = 0; i < SD_DT__COUNT; i++) {
    if (strcmp(s, dtypes[i].name) == 0) {
      if (out) *out = (sd_dtype)i;
      return 0;
    }
  }
  for (size_t i = 0; i < sizeof subbyte / sizeof subbyte[0]; i++) {
    if (strcmp(s, subbyte[i]) == 0)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                     "dtype %s is a sub-byte type; sub-byte dtypes (F4, F6) are not supported",
                     subbyte[i]);
  }
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "unknown dtype '%s'",
                 sd_msgstr(shown, sizeof shown, s, strlen(s)));
}

const char *sd_dtype_name(sd_dtype dt) {
  return (unsigned)dt < SD_DT__COUNT ? dtypes[dt].name : "invalid";
}

unsigned sd_dtype_size(sd_dtype dt) {
  return (unsigned)dt < SD_DT__COUNT ? dtypes[dt].size : 0;
}
