/* The checkpoint index, byte for byte what Python's json.dumps(index, indent=2, sort_keys=True) + "\n" gives. */
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

char *sd_index_encode(const sd_plan *p, const sd_tensor *tensors, size_t *len, sd_error *err) {
  size_t n = p->ntensors;
  /* UTF-8 byte order equals code point order, which is how Python sorts. */
  sd_skey *e = malloc((n ? n : 1) * sizeof *e);
  if (!e) {
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    if (p->loc[i].file >= p->nfiles) {
      free(e);
      sd_fail(err, SHARDD_E_INTERNAL, "tensor %zu has no file in the plan", i);
      return NULL;
    }
    e[i] = (sd_skey){(const unsigned char *)tensors[i].name, (uint32_t)strlen(tensors[i].name),
                     (uint32_t)i};
  }
  if (sd_sort_keys(e, n)) {
    free(e);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }

  sd_buf b = {0};
  sd_buf_reserve(&b, 128 + n * 96);
  sd_buf_puts(&b, "{\n  \"metadata\": {\n    \"total_parameters\": ");
  sd_buf_put_u64(&b, p->total_parameters);
  sd_buf_puts(&b, ",\n    \"total_size\": ");
  sd_buf_put_u64(&b, p->total_size);
  sd_buf_puts(&b, "\n  },\n  \"weight_map\": {");
  for (size_t i = 0; i < n; i++) {
    if (i + 8 < n) {
      __builtin_prefetch(&p->loc[e[i + 8].idx]);
      __builtin_prefetch(e[i + 8].key);
    }
    sd_buf_puts(&b, i ? ",\n    " : "\n    ");
    const char *file = p->files[p->loc[e[i].idx].file].name;
    sd_buf_json_str_ascii(&b, (const char *)e[i].key, e[i].len);
    sd_buf_puts(&b, ": ");
    sd_buf_json_str_ascii(&b, file, strlen(file));
  }
  sd_buf_puts(&b, n ? "\n  }\n}\n" : "}\n}\n");
  sd_buf_putc(&b, '\0');
  free(e);
  if (b.oom) {
    free(b.p);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }
  if (len) *len = b.len - 1;
  return b.p;
}
