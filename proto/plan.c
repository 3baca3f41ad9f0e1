/* Shard planning: tensor order, huggingface_hub's greedy split, file names, per-file headers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"
#include "sd_layout.h"

/* Leaves room for "-00001-of-00001.safetensors.index.json" within NAME_MAX. */
#define PREFIX_MAX 200

int sd_prefix_check(const char *prefix, sd_error *err) {
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
 * Files and the split
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

/* Natural name order, which also finds duplicates: it is a total order, so
 * equal names are neighbours. Positions given by the client then come first,
 * in position order, by a stable sort on the position alone. */
static int walk_order(const sd_tensor *t, const uint32_t *name_len, size_t n, int any_index,
                      uint32_t *ord, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  int rc = 0;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += sd_natural_key_max(name_len[i]);
  unsigned char *arena = malloc(total ? total : 1);
  sd_skey *k = malloc((n ? n : 1) * sizeof *k);
  if (!arena || !k) goto oom;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = sd_natural_key(t[i].name, name_len[i], arena + o);
    k[i] = (sd_skey){arena + o, (uint32_t)len, (uint32_t)i};
    o += len;
  }
  if (sd_sort_keys(k, n)) goto oom;
  for (size_t i = 0; i < n; i++) {
    if (i && k[i].len == k[i - 1].len && memcmp(k[i].key, k[i - 1].key, k[i].len) == 0) {
      const char *nm = t[k[i].idx].name;
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s' is given twice",
                   sd_msgstr(shown, sizeof shown, nm, name_len[k[i].idx]));
      goto out;
    }
    ord[i] = k[i].idx;
  }
  if (any_index) {
    /* 8-byte big-endian positions; no position sorts after every one. */
    for (size_t i = 0; i < n; i++) {
      const sd_tensor *x = &t[ord[i]];
      uint64_t pos = x->index >= 0 ? (uint64_t)x->index : UINT64_MAX;
      unsigned char *kb = arena + 8 * i; /* the natural keys are no longer needed */
      for (int b = 0; b < 8; b++) kb[b] = (unsigned char)(pos >> (8 * (7 - b)));
      k[i] = (sd_skey){kb, 8, ord[i]};
    }
    if (sd_sort_keys(k, n)) goto oom;
    for (size_t i = 0; i < n; i++) ord[i] = k[i].idx;
  }
  goto out;
oom:
  rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory ordering %zu tensors", n);
out:
  free(k);
  free(arena);
  return rc;
}

/* The reference writer's order inside a file: larger elements first, then
 * name bytes (strcmp). */
static int header_order(sd_plan_file *pf, const sd_tensor *t, const uint32_t *name_len,
                        sd_skey *k) {
  size_t n = pf->ntensors;
  for (size_t i = 0; i < n; i++) {
    uint32_t ti = pf->tensors[i];
    k[i] = (sd_skey){(const unsigned char *)t[ti].name, name_len[ti], ti};
  }
  /* Natural order and byte order agree unless digit runs of different
   * lengths meet (layers.9 / layers.10), so this is usually one or a few
   * sorted runs, which the sort merely checks or merges. */
  if (sd_sort_keys(k, n)) return SHARDD_E_NO_MEMORY;
  /* Stable bucketing by element size (8, 4, 2, 1); len is free for it now. */
  size_t at[9] = {0};
  for (size_t i = 0; i < n; i++) {
    k[i].len = sd_dtype_size(t[k[i].idx].dtype);
    at[k[i].len]++;
  }
  size_t acc = 0;
  for (unsigned es = 8; es >= 1; es /= 2) {
    size_t c = at[es];
    at[es] = acc;
    acc += c;
  }
  for (size_t i = 0; i < n; i++) pf->tensors[at[k[i].len]++] = k[i].idx;
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
  uint32_t *name_len = NULL, *ord = NULL, *shard_of = NULL, *group_final = NULL;
  sd_skey *hk = NULL;
  sd_buf meta = {0};

  memset(p, 0, sizeof *p);
  if (!opts) opts = &defaults;
  uint64_t max = opts->max_shard_size ? opts->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  const char *prefix = opts->prefix ? opts->prefix : SD_DEFAULT_PREFIX;
  if ((rc = sd_prefix_check(prefix, err))) return rc;
  if (n >= (1u << 28)) /* the name sort's limit; far beyond any header limit anyway */
    return sd_fail(err, SHARDD_E_LIMIT, "%zu tensors is more than a checkpoint can hold", n);
  if (n && !tensors) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensors are missing");

  size_t alloc_n = n ? n : 1;
  nbytes = malloc(alloc_n * sizeof *nbytes);
  name_len = malloc(alloc_n * sizeof *name_len);
  ord = malloc(alloc_n * sizeof *ord);
  shard_of = malloc(alloc_n * sizeof *shard_of);
  group_final = malloc((alloc_n + 1) * sizeof *group_final);
  p->loc = calloc(alloc_n, sizeof *p->loc);
  if (!nbytes || !name_len || !ord || !shard_of || !group_final || !p->loc) {
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
  if ((rc = walk_order(tensors, name_len, n, any_index, ord, err))) goto fail;

  size_t nfiles = n ? hf_split(ord, nbytes, n, max, shard_of, group_final) : 1;
  p->files = calloc(nfiles, sizeof *p->files);
  if (!p->files) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
    goto fail;
  }
  p->nfiles = nfiles;
  for (size_t i = 0; i < n; i++) p->files[shard_of[i]].ntensors++;
  size_t most = 1;
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
    if (pf->ntensors > most) most = pf->ntensors;
    pf->ntensors = 0;
  }
  for (size_t i = 0; i < n; i++) {
    sd_plan_file *pf = &p->files[shard_of[i]];
    pf->tensors[pf->ntensors++] = ord[i];
  }
  hk = malloc(most * sizeof *hk);
  if (!hk) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
    goto fail;
  }

  if ((rc = sd_header_meta_json(opts->metadata, opts->metadata ? opts->nmetadata : 0, &meta, err)))
    goto fail;
  for (size_t f = 0; f < nfiles; f++) {
    if (header_order(&p->files[f], tensors, name_len, hk)) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory ordering %s", p->files[f].name);
      goto fail;
    }
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
  free(shard_of);
  free(group_final);
  free(hk);
  return rc;
}
