/* The checkpoint index, byte for byte what Python's json.dumps(index, indent=2, sort_keys=True) + "\n" gives. */
#include <stdlib.h>
#include <string.h>

#include "sd_checksum.h"
#include "sd_format.h"
#include "sd_layout.h"

#define SUM_PLACEHOLDER "00000000"
#define SUMS_AT "{\n  \"metadata\": {\n    \"" SD_CHECKSUM_KEY "\": {\n"

/* The checksum map's files in name order, as sort_keys gives them (plan
 * order is name order until the numbers outgrow five digits); NULL: no memory. */
static int by_name(const void *a, const void *b, void *plan) {
  const sd_plan *p = plan;
  return strcmp(p->files[*(const size_t *)a].name, p->files[*(const size_t *)b].name);
}

static size_t *files_by_name(const sd_plan *p) {
  size_t *o = malloc((p->nfiles ? p->nfiles : 1) * sizeof *o);
  if (!o) return NULL;
  for (size_t f = 0; f < p->nfiles; f++) o[f] = f;
  int sorted = 1;
  for (size_t f = 1; f < p->nfiles && sorted; f++) sorted = strcmp(p->files[f - 1].name, p->files[f].name) < 0;
  if (!sorted) qsort_r(o, p->nfiles, sizeof *o, by_name, (void *)p);
  return o;
}

static char *index_oom(sd_error *err) {
  sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding the index");
  return NULL;
}

char *sd_index_encode(const sd_plan *p, const sd_tensor *tensors, size_t *len, sd_error *err) {
  size_t n = p->ntensors;
  /* UTF-8 byte order equals code point order, which is how Python sorts. */
  sd_skey *e = sd_big_alloc((n ? n : 1) * sizeof *e);
  size_t *fo = malloc((p->nfiles + 1) * sizeof *fo);
  if (!e || !fo) {
    free(e);
    free(fo);
    return index_oom(err);
  }

  /* Each file's `": "name"` part is escaped once, not once per tensor. */
  sd_buf fv = {0};
  for (size_t f = 0; f < p->nfiles; f++) {
    fo[f] = fv.len;
    sd_buf_puts(&fv, ": ");
    sd_buf_json_str_ascii(&fv, p->files[f].name, strlen(p->files[f].name));
  }
  fo[p->nfiles] = fv.len;

  /* Files in order, each in header order: for a checkpoint whose tensors
   * share one dtype that is a handful of sorted runs, cheap to merge. The
   * output size is exact for names that need no escaping. */
  size_t m = 0, need = 256, worst = 0; /* 256: the fixed text around the weight map */
  for (size_t f = 0; f < p->nfiles; f++) {
    const sd_plan_file *pf = &p->files[f];
    size_t vlen = fo[f + 1] - fo[f];
    for (size_t j = 0; j < pf->ntensors && m < n; j++) {
      uint32_t i = pf->tensors[j];
      if (j + 8 < pf->ntensors) __builtin_prefetch(&tensors[pf->tensors[j + 8]]);
      if (j + 4 < pf->ntensors) __builtin_prefetch(tensors[pf->tensors[j + 4]].name);
      size_t l = strlen(tensors[i].name);
      /* The file number rides along in place of the tensor's: it is all
       * the weight map needs, and saves a lookup per entry. */
      e[m++] = (sd_skey){(const unsigned char *)tensors[i].name, (uint32_t)l, (uint32_t)f};
      need += 6 + l + 2 + vlen;
      if (6 + SD_JSON_STR_MAX(l) + vlen > worst) worst = 6 + SD_JSON_STR_MAX(l) + vlen;
    }
  }
  if (m != n) {
    free(e);
    free(fo);
    free(fv.p);
    sd_fail(err, SHARDD_E_INTERNAL, "the plan's files hold %zu of its %zu tensors", m, n);
    return NULL;
  }
  /* Room for the worst case of one more entry beyond the exact size, so
   * the per-entry check below never regrows the buffer for plain names.
   * It is the sort's scratch until the sort is done. */
  sd_buf b = {sd_big_alloc(need + worst), 0, need + worst, 0};
  if (!b.p || sd_sort_keys_in(e, n, b.p, b.cap)) {
    free(b.p);
    free(e);
    free(fo);
    free(fv.p);
    return index_oom(err);
  }

  sd_buf_puts(&b, "{\n  \"metadata\": {\n");
  if (p->checksums) {
    size_t *order = files_by_name(p);
    if (!order) b.oom = 1;
    sd_buf_puts(&b, "    \"" SD_CHECKSUM_KEY "\": {\n");
    for (size_t k = 0; order && k < p->nfiles; k++) {
      const char *name = p->files[order[k]].name;
      sd_buf_puts(&b, "      ");
      sd_buf_json_str_ascii(&b, name, strlen(name));
      sd_buf_puts(&b, k + 1 < p->nfiles ? ": \"" SUM_PLACEHOLDER "\",\n" : ": \"" SUM_PLACEHOLDER "\"\n");
    }
    free(order);
    sd_buf_puts(&b, "    },\n");
  }
  sd_buf_puts(&b, "    \"total_parameters\": ");
  sd_buf_put_u64(&b, p->total_parameters);
  sd_buf_puts(&b, ",\n    \"total_size\": ");
  sd_buf_put_u64(&b, p->total_size);
  sd_buf_puts(&b, "\n  },\n  \"weight_map\": {");
  for (size_t i = 0; i < n && !b.oom; i++) {
    if (i + 8 < n) __builtin_prefetch(e[i + 8].key);
    uint32_t f = e[i].idx;
    size_t vlen = fo[f + 1] - fo[f];
    sd_buf_reserve(&b, 6 + SD_JSON_STR_MAX(e[i].len) + vlen);
    if (b.oom) break;
    char *o = b.p + b.len;
    if (i) *o++ = ',';
    memcpy(o, "\n    ", 5);
    o += 5;
    o = sd_json_str_ascii_put(o, (const char *)e[i].key, e[i].len);
    memcpy(o, fv.p + fo[f], vlen);
    b.len = (size_t)(o + vlen - b.p);
  }
  sd_buf_puts(&b, n ? "\n  }\n}\n" : "}\n}\n");
  sd_buf_putc(&b, '\0');
  free(e);
  free(fo);
  int oom = fv.oom;
  free(fv.p);
  if (b.oom || oom) {
    free(b.p);
    return index_oom(err);
  }
  if (len) *len = b.len - 1;
  return b.p;
}

/* The placeholders sit where sd_index_encode put them: the checksum map
 * opens the metadata, one file a line, in name order. */
int sd_index_put_sums(char *json, size_t len, const sd_plan *p, const uint32_t *crcs, sd_error *err) {
  size_t at = sizeof SUMS_AT - 1;
  if (!p->checksums || len < at || memcmp(json, SUMS_AT, at))
    return sd_fail(err, SHARDD_E_INTERNAL, "%s: the index has no checksum map to fill", p->index_name);
  sd_buf name = {0};
  size_t *order = files_by_name(p);
  if (!order) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory filling the index's checksums");
  for (size_t k = 0; k < p->nfiles; k++) {
    size_t f = order[k];
    name.len = 0;
    sd_buf_puts(&name, "      ");
    sd_buf_json_str_ascii(&name, p->files[f].name, strlen(p->files[f].name));
    sd_buf_puts(&name, ": \"");
    if (name.oom) {
      free(name.p);
      free(order);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory filling the index's checksums");
    }
    if (len - at < name.len + SD_CHECKSUM_HEX + 1 || memcmp(json + at, name.p, name.len) ||
        memcmp(json + at + name.len, SUM_PLACEHOLDER, SD_CHECKSUM_HEX)) {
      free(name.p);
      free(order);
      return sd_fail(err, SHARDD_E_INTERNAL, "%s: no checksum placeholder for %s", p->index_name, p->files[f].name);
    }
    at += name.len;
    char hex[SD_CHECKSUM_HEX + 1];
    sd_crc32c_hex(crcs[f], hex);
    memcpy(json + at, hex, SD_CHECKSUM_HEX);
    at += SD_CHECKSUM_HEX + (k + 1 < p->nfiles ? 3 : 2); /* the quote, the comma and the newline */
  }
  free(name.p);
  free(order);
  return 0;
}
