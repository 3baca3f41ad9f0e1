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
  /* Files in order, each in header order: for a checkpoint whose tensors
   * share one dtype that is a handful of sorted runs, cheap to merge. */
  size_t m = 0;
  for (size_t f = 0; f < p->nfiles; f++) {
    for (size_t j = 0; j < p->files[f].ntensors && m < n; j++) {
      uint32_t i = p->files[f].tensors[j];
      if (j + 8 < p->files[f].ntensors) __builtin_prefetch(&tensors[p->files[f].tensors[j + 8]]);
      e[m++] = (sd_skey){(const unsigned char *)tensors[i].name, (uint32_t)strlen(tensors[i].name),
                         i};
    }
  }
  if (m != n) {
    free(e);
    sd_fail(err, SHARDD_E_INTERNAL, "the plan's files hold %zu of its %zu tensors", m, n);
    return NULL;
  }
  if (sd_sort_keys(e, n)) {
    free(e);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }

  /* Each file's `": "name"` part is escaped once, not once per tensor. */
  sd_buf fv = {0};
  size_t *fo = malloc((p->nfiles + 1) * sizeof *fo);
  if (!fo) {
    free(e);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }
  for (size_t f = 0; f < p->nfiles; f++) {
    fo[f] = fv.len;
    sd_buf_puts(&fv, ": ");
    sd_buf_json_str_ascii(&fv, p->files[f].name, strlen(p->files[f].name));
  }
  fo[p->nfiles] = fv.len;

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
    uint32_t f = p->loc[e[i].idx].file;
    sd_buf_json_str_ascii(&b, (const char *)e[i].key, e[i].len);
    sd_buf_put(&b, fv.p + fo[f], fo[f + 1] - fo[f]);
  }
  sd_buf_puts(&b, n ? "\n  }\n}\n" : "}\n}\n");
  sd_buf_putc(&b, '\0');
  free(e);
  free(fo);
  int oom = fv.oom;
  free(fv.p);
  if (b.oom || oom) {
    free(b.p);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
    return NULL;
  }
  if (len) *len = b.len - 1;
  return b.p;
}
