/* Shard planning: tensor order, huggingface_hub's greedy split, file names, per-file headers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

/* Leaves room for "-00001-of-00001.safetensors.index.json" within NAME_MAX. */
#define PREFIX_MAX 200

static int prefix_check(const char *prefix, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  size_t len = strlen(prefix);
  const char *why = NULL;
  size_t bad;
  if (len == 0)
    why = "is empty";
  else if (len > PREFIX_MAX)
    why = "is too long";
  else if (prefix[0] == '.')
    why = "starts with '.'";
  else if (strchr(prefix, '/'))
    why = "contains '/'";
  else if (!sd_utf8_valid(prefix, len, &bad))
    why = "is not valid UTF-8";
  else
    for (size_t i = 0; i < len; i++)
      if ((unsigned char)prefix[i] < 0x20 || prefix[i] == 0x7F) why = "contains a control character";
  if (why)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "prefix '%s' %s: it must be a plain file name",
                   sd_msgstr(shown, sizeof shown, prefix, len), why);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Plan
 * ------------------------------------------------------------------------ */
void sd_plan_free(sd_plan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nfiles; i++) {
    free(p->files[i].name);
    free(p->files[i].tensors);
    free(p->files[i].header);
  }
  free(p->files);
  free(p->loc);
  free(p->index_name);
  memset(p, 0, sizeof *p);
}

__attribute__((format(printf, 1, 2))) static char *str_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (len < 0) return NULL;
  char *s = malloc((size_t)len + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)len + 1, fmt, ap);
  va_end(ap);
  return s;
}

/* huggingface_hub's split_state_dict_into_shards_factory, step for step: a
 * tensor over the limit becomes a shard of its own and is appended to the
 * list at once, while the shard being filled stays open; a tensor that
 * would tip the open shard over the limit closes it first. Fills shard_of[]
 * (final shard number per position in walk order); returns the count. */
static size_t hf_split(const uint32_t *ord, const uint64_t *nbytes, size_t n, uint64_t max,
                       uint32_t *shard_of, uint32_t *group_final) {
  size_t nshards = 0, ngroups = 0;
  uint32_t cur = UINT32_MAX; /* group of the open shard; none yet */
  uint64_t cur_size = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t sz = nbytes[ord[i]];
    if (sz > max) {
      group_final[ngroups] = (uint32_t)nshards++;
      shard_of[i] = (uint32_t)ngroups++;
      continue;
    }
    if (cur != UINT32_MAX && cur_size + sz > max) {
      group_final[cur] = (uint32_t)nshards++;
      cur = UINT32_MAX;
      cur_size = 0;
    }
    if (cur == UINT32_MAX) cur = (uint32_t)ngroups++;
    shard_of[i] = cur;
    cur_size += sz;
  }
  if (cur != UINT32_MAX) group_final[cur] = (uint32_t)nshards++;
  for (size_t i = 0; i < n; i++) shard_of[i] = group_final[shard_of[i]];
  return nshards;
}

/* ------------------------------------------------------------------------ *
 * Order
 * ------------------------------------------------------------------------ */

/* Walk order as sort keys: positions given by the client first, in position
 * order (a 0x00 byte and the position big-endian), then the others (0x01),
 * each group in natural name order. */
static int walk_order(const sd_tensor *t, const uint32_t *name_len, size_t n, int any_index,
                      uint32_t *ord) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += 9 + sd_natural_key_max(name_len[i]);
  unsigned char *arena = malloc(total ? total : 1);
  sd_skey *k = malloc(n * sizeof *k);
  if (!arena || !k) {
    free(arena);
    free(k);
    return SHARDD_E_NO_MEMORY;
  }
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char *p = arena + o;
    size_t len = 0;
    if (any_index) {
      if (t[i].index >= 0) {
        p[len++] = 0;
        for (int b = 7; b >= 0; b--) p[len++] = (unsigned char)((uint64_t)t[i].index >> (8 * b));
      } else {
        p[len++] = 1;
      }
    }
    len += sd_natural_key(t[i].name, name_len[i], p + len);
    k[i] = (sd_skey){p, (uint32_t)len, (uint32_t)i};
    o += len;
  }
  int rc = sd_sort_keys(k, n);
  if (!rc)
    for (size_t i = 0; i < n; i++) ord[i] = k[i].idx;
  free(k);
  free(arena);
  return rc;
}

/* Name order (bytes, as strcmp): finds duplicates as neighbours, and is the
 * tie order inside each file's header. */
static int name_order(const sd_tensor *t, const uint32_t *name_len, size_t n, uint32_t *byname,
                      sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  sd_skey *k = malloc((n ? n : 1) * sizeof *k);
  if (!k) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory sorting %zu tensor names", n);
  for (size_t i = 0; i < n; i++)
    k[i] = (sd_skey){(const unsigned char *)t[i].name, name_len[i], (uint32_t)i};
  if (sd_sort_keys(k, n)) {
    free(k);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory sorting %zu tensor names", n);
  }
  for (size_t i = 0; i < n; i++) {
    if (i && k[i].len == k[i - 1].len && memcmp(k[i].key, k[i - 1].key, k[i].len) == 0) {
      int rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s' is given twice",
                       sd_msgstr(shown, sizeof shown, (const char *)k[i].key, k[i].len));
      free(k);
      return rc;
    }
    byname[i] = k[i].idx;
  }
  free(k);
  return 0;
}

/* The reference writer's order inside a file: larger elements first, then
 * name bytes. Bucketing the global name order by (file, element size)
 * gives it for every file in one pass, with no per-file sort. */
static int fill_files(sd_plan *p, const sd_tensor *t, size_t n, const uint32_t *byname,
                      const uint32_t *file_of) {
  static const unsigned classes[4] = {8, 4, 2, 1};
  size_t nf = p->nfiles;
  size_t *cur = calloc(nf * 4, sizeof *cur);
  if (!cur) return SHARDD_E_NO_MEMORY;
  for (size_t i = 0; i < n; i++) {
    unsigned es = sd_dtype_size(t[i].dtype);
    unsigned c = es == 8 ? 0 : es == 4 ? 1 : es == 2 ? 2 : 3;
    cur[file_of[i] * 4 + c]++;
  }
  for (size_t f = 0; f < nf; f++) {
    size_t acc = 0;
    for (unsigned c = 0; c < 4; c++) {
      size_t k = cur[f * 4 + c];
      cur[f * 4 + c] = acc;
      acc += k;
    }
  }
  for (size_t j = 0; j < n; j++) {
    uint32_t i = byname[j];
    unsigned es = sd_dtype_size(t[i].dtype);
    unsigned c = 0;
    while (classes[c] != es) c++;
    p->files[file_of[i]].tensors[cur[file_of[i] * 4 + c]++] = i;
  }
  free(cur);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Plan
 * ------------------------------------------------------------------------ */
int sd_plan_build(sd_plan *p, const sd_tensor *tensors, size_t n, const sd_plan_opts *opts,
                  sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  static const sd_plan_opts defaults = {0, NULL, NULL, 0};
  int rc = 0;
  uint64_t *nbytes = NULL;
  uint32_t *name_len = NULL, *ord = NULL, *byname = NULL, *shard_of = NULL, *file_of = NULL,
           *group_final = NULL;
  sd_buf meta = {0};

  memset(p, 0, sizeof *p);
  if (!opts) opts = &defaults;
  uint64_t max = opts->max_shard_size ? opts->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  const char *prefix = opts->prefix ? opts->prefix : SD_DEFAULT_PREFIX;
  if ((rc = prefix_check(prefix, err))) return rc;
  if (n > UINT32_MAX - 1)
    return sd_fail(err, SHARDD_E_LIMIT, "%zu tensors is more than a checkpoint can hold", n);
  if (n && !tensors) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensors are missing");

  size_t alloc_n = n ? n : 1;
  nbytes = malloc(alloc_n * sizeof *nbytes);
  name_len = malloc(alloc_n * sizeof *name_len);
  ord = malloc(alloc_n * sizeof *ord);
  byname = malloc(alloc_n * sizeof *byname);
  shard_of = malloc(alloc_n * sizeof *shard_of);
  file_of = malloc(alloc_n * sizeof *file_of);
  group_final = malloc((alloc_n + 1) * sizeof *group_final);
  p->loc = calloc(alloc_n, sizeof *p->loc);
  if (!nbytes || !name_len || !ord || !byname || !shard_of || !file_of || !group_final || !p->loc) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu tensors", n);
    goto fail;
  }
  p->ntensors = n;

  /* Validate every tensor and total the sizes. */
  int any_index = 0;
  for (size_t i = 0; i < n; i++) {
    const sd_tensor *t = &tensors[i];
    size_t len = t->name ? strlen(t->name) : 0;
    if ((rc = sd_name_check(t->name, len, err))) goto fail;
    name_len[i] = (uint32_t)len;
    if ((rc = sd_tensor_nbytes(t, &nbytes[i], err))) goto fail;
    uint64_t numel = 0;
    sd_tensor_numel(t->name, t->ndim, t->shape, &numel, NULL);
    if (__builtin_add_overflow(p->total_size, nbytes[i], &p->total_size) ||
        p->total_size > (uint64_t)INT64_MAX - SD_HEADER_MAX - SD_HEADER_ALIGN) {
      rc = sd_fail(err, SHARDD_E_LIMIT, "tensor '%s': the checkpoint's total size overflows",
                   sd_msgstr(shown, sizeof shown, t->name, len));
      goto fail;
    }
    p->total_parameters += numel; /* <= total_size: no overflow */
    if (t->index >= 0) any_index = 1;
  }
  if ((rc = name_order(tensors, name_len, n, byname, err))) goto fail;
  if (walk_order(tensors, name_len, n, any_index, ord)) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory ordering %zu tensors", n);
    goto fail;
  }

  size_t nfiles = n ? hf_split(ord, nbytes, n, max, shard_of, group_final) : 1;
  p->files = calloc(nfiles, sizeof *p->files);
  if (!p->files) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
    goto fail;
  }
  p->nfiles = nfiles;
  for (size_t i = 0; i < n; i++) file_of[ord[i]] = shard_of[i];
  for (size_t i = 0; i < n; i++) p->files[file_of[i]].ntensors++;
  for (size_t f = 0; f < nfiles; f++) {
    sd_plan_file *pf = &p->files[f];
    pf->name = nfiles == 1 ? str_printf("%s.safetensors", prefix)
                           : str_printf("%s-%05u-of-%05u.safetensors", prefix, (unsigned)f + 1,
                                        (unsigned)nfiles);
    pf->tensors = malloc((pf->ntensors ? pf->ntensors : 1) * sizeof *pf->tensors);
    if (!pf->name || !pf->tensors) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
      goto fail;
    }
  }
  if (fill_files(p, tensors, n, byname, file_of)) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
    goto fail;
  }

  if ((rc = sd_header_meta_json(opts->metadata, opts->metadata ? opts->nmetadata : 0, &meta, err)))
    goto fail;
  for (size_t f = 0; f < nfiles; f++) {
    if ((rc = sd_header_encode(&p->files[f], (uint32_t)f, tensors, nbytes, name_len, meta.p,
                               meta.len, p->loc, err)))
      goto fail;
  }

  p->needs_index = nfiles > 1;
  p->index_name = str_printf("%s.safetensors.index.json", prefix);
  if (!p->index_name) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning");
    goto fail;
  }
  rc = 0;
  goto out;

fail:
  sd_plan_free(p);
out:
  free(meta.p);
  free(nbytes);
  free(name_len);
  free(ord);
  free(byname);
  free(shard_of);
  free(file_of);
  free(group_final);
  return rc;
}
