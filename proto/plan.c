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
    if (!p->headers) free(p->files[i].header);
  }
  if (!p->headers) free(p->loc);
  free(p->headers);
  free(p->files);
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
 * would tip the open shard over the limit closes it first. Tensors that
 * share an index (neighbours in walk order) are one entry, as
 * huggingface_hub takes tensors sharing one storage (transformers' views of
 * one fused parameter): counted once with all their bytes, at that place,
 * and kept in one shard. Fills shard_of[] (final shard number per position
 * in walk order); returns the count. */
static size_t hf_split(const uint32_t *ord, const uint64_t *nbytes, const sd_tensor *t, size_t n,
                       uint64_t max, uint32_t *shard_of, uint32_t *group_final) {
  size_t nshards = 0, ngroups = 0;
  uint32_t cur = UINT32_MAX; /* group of the open shard; none yet */
  uint64_t cur_size = 0;
  for (size_t i = 0, end; i < n; i = end) {
    /* No overflow: the planner has checked that every tensor's bytes sum. */
    uint64_t sz = nbytes[ord[i]];
    int64_t at = t[ord[i]].index;
    for (end = i + 1; at >= 0 && end < n && t[ord[end]].index == at; end++) sz += nbytes[ord[end]];
    uint32_t into;
    if (sz > max) {
      group_final[ngroups] = (uint32_t)nshards++;
      into = (uint32_t)ngroups++;
    } else {
      if (cur != UINT32_MAX && cur_size + sz > max) {
        group_final[cur] = (uint32_t)nshards++;
        cur = UINT32_MAX;
        cur_size = 0;
      }
      if (cur == UINT32_MAX) cur = (uint32_t)ngroups++;
      into = cur;
      cur_size += sz;
    }
    for (size_t k = i; k < end; k++) shard_of[k] = into;
  }
  if (cur != UINT32_MAX) group_final[cur] = (uint32_t)nshards++;
  for (size_t i = 0; i < n; i++) shard_of[i] = group_final[shard_of[i]];
  return nshards;
}

/* ------------------------------------------------------------------------ *
 * File series: the tensors of each prefix split apart
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *prefix[SD_MAX_SERIES]; /* [0]: the plan's own */
  size_t nseries;
  size_t first_file[SD_MAX_SERIES], files[SD_MAX_SERIES];
  size_t nfiles;
} series_split;

/* The walk order regrouped series by series (stable within each), then each series split as
 * save_pretrained splits a state dict; shard_of[i] is ord[i]'s file, numbered across series. */
static int split_series(const sd_tensor *t, uint32_t *ord, size_t n, const uint64_t *nbytes, uint64_t max,
                        uint32_t *shard_of, uint32_t *group_final, series_split *ss, sd_error *err) {
  uint8_t *series = NULL;
  uint32_t *regrouped = NULL;
  size_t count[SD_MAX_SERIES] = {0};
  for (size_t i = 0; i < n; i++) {
    const char *pre = t[ord[i]].prefix;
    if (!pre || pre == ss->prefix[0] || strcmp(pre, ss->prefix[0]) == 0) continue;
    if (!series && !(series = calloc(n, 1))) goto oom;
    size_t s = 1;
    while (s < ss->nseries && pre != ss->prefix[s] && strcmp(pre, ss->prefix[s]) != 0) s++;
    if (s == ss->nseries) {
      int rc = sd_prefix_check(pre, err);
      if (rc || s == SD_MAX_SERIES) {
        free(series);
        return rc ? rc : sd_fail(err, SHARDD_E_LIMIT, "tensor '%.200s' asks for a file prefix '%.100s': a checkpoint holds at "
                       "most %d prefixes", t[ord[i]].name, pre, SD_MAX_SERIES);
      }
      ss->prefix[ss->nseries++] = pre;
    }
    series[i] = (uint8_t)s;
  }
  if (ss->nseries > 1) {
    if (!(regrouped = malloc(n * sizeof *regrouped))) goto oom;
    for (size_t i = 0; i < n; i++) count[series[i]]++;
    size_t at[SD_MAX_SERIES], sum = 0;
    for (size_t s = 0; s < ss->nseries; s++) at[s] = sum, sum += count[s];
    for (size_t i = 0; i < n; i++) regrouped[at[series[i]]++] = ord[i];
    memcpy(ord, regrouped, n * sizeof *ord);
  } else {
    count[0] = n;
  }
  size_t done = 0;
  for (size_t s = 0; s < ss->nseries; s++) {
    /* No tensors at all: one empty file, as save_pretrained writes; none for a series left empty. */
    size_t got = count[s] ? hf_split(ord + done, nbytes, t, count[s], max, shard_of + done, group_final) : n == 0;
    for (size_t i = done; i < done + count[s]; i++) shard_of[i] += (uint32_t)ss->nfiles;
    ss->first_file[s] = ss->nfiles;
    ss->files[s] = got;
    ss->nfiles += got;
    done += count[s];
  }
  free(series);
  free(regrouped);
  return 0;
oom:
  free(series);
  return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu tensors", n);
}

static int name_ptr_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Two series must not name the same file ("a" split in two makes a-00001-of-00002.safetensors,
 * which is also what a series "a-00001-of-00002" of one file is called). */
static int names_distinct(const sd_plan *p, sd_error *err) {
  char **names = malloc(p->nfiles * sizeof *names);
  if (!names) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", p->nfiles);
  for (size_t f = 0; f < p->nfiles; f++) names[f] = p->files[f].name;
  qsort(names, p->nfiles, sizeof *names, name_ptr_cmp);
  int rc = 0;
  for (size_t f = 1; f < p->nfiles && !rc; f++)
    if (strcmp(names[f], names[f - 1]) == 0)
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "two file prefixes of the save both make %.200s", names[f]);
  free(names);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * Order
 * ------------------------------------------------------------------------ */

/* 8 bytes of a tensor's position, big-endian: no position sorts after every one. */
static void put_position(const sd_tensor *t, unsigned char *kb) {
  uint64_t pos = t->index >= 0 ? (uint64_t)t->index : UINT64_MAX;
  for (int b = 0; b < 8; b++) kb[b] = (unsigned char)(pos >> (8 * (7 - b)));
}

/* Natural-order keys for every name, each after its position when by_pos, packed from o on
 * (*used bytes in all); 0 when they would run past end. */
static int make_keys(const sd_tensor *t, const uint32_t *name_len, size_t n, int by_pos, sd_skey *k,
                     unsigned char *o, const unsigned char *end, size_t *used) {
  unsigned char *start = o;
  size_t pre = by_pos ? 8 : 0;
  for (size_t i = 0; i < n; i++) {
    if ((size_t)(end - o) < pre + sd_natural_key_max(name_len[i])) return 0;
    if (by_pos) put_position(&t[i], o);
    size_t len = pre + sd_natural_key(t[i].name, name_len[i], o + pre);
    k[i] = (sd_skey){o, (uint32_t)len, (uint32_t)i};
    o += len;
  }
  *used = (size_t)(o - start);
  return 1;
}

/* Scratch walk_order needs besides the keys themselves: the key array,
 * 8-byte position keys, and the sort's work space (8-aligned). */
static size_t walk_scratch_min(size_t n) {
  return n * (sizeof(sd_skey) + 8) + sd_sort_keys_scratch(n) + 8;
}

/* Natural name order, which also finds duplicates: it is a total order, so
 * equal names are neighbours. Positions given by the client then come first,
 * in position order, by a stable sort on the position alone; or, when the
 * caller knows its names differ (names_unique), by one sort of keys that
 * start with the position, which is the same order. Works in
 * scratch of at least walk_scratch_min(n) bytes: the block that later holds
 * the headers from its start and the locations at its end, so the layout
 * keeps to pages touched again there: the key array, the keys and the sort
 * space from the front, positions (rarely needed) at the back. Only keys
 * that outgrow the space get memory of their own. */
static int walk_order(const sd_tensor *t, const uint32_t *name_len, size_t n, int any_index, int names_unique,
                      uint32_t *ord, unsigned char *scratch, size_t scratch_size, sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  int rc = 0;
  if (n == 0) return 0;
  sd_skey *k = (sd_skey *)scratch;
  unsigned char *pos_keys = scratch + scratch_size - 8 * n, *arena = scratch + n * sizeof(sd_skey);
  unsigned char *sort_tmp = arena, *own = NULL;
  size_t keys_len = 0;
  int by_pos = any_index && names_unique;
  /* (8 spare bytes: the sort space starts 8-aligned after the keys.) */
  if (make_keys(t, name_len, n, by_pos, k, arena, pos_keys - sd_sort_keys_scratch(n) - 8, &keys_len)) {
    sort_tmp = arena + ((keys_len + 7) & ~(size_t)7);
  } else {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += (by_pos ? 8 : 0) + sd_natural_key_max(name_len[i]);
    own = sd_big_alloc(n * sizeof(sd_skey) + total);
    if (!own) goto oom;
    k = (sd_skey *)own;
    arena = own + n * sizeof(sd_skey);
    make_keys(t, name_len, n, by_pos, k, arena, arena + total, &keys_len);
  }
  if (sd_sort_keys_in(k, n, sort_tmp, sd_sort_keys_scratch(n))) goto oom;
  for (size_t i = 0; i < n; i++) {
    /* Sorted order is scattered across the keys' memory: fetch ahead. */
    if (i + 8 < n) __builtin_prefetch(k[i + 8].key);
    if (i && k[i].len == k[i - 1].len && memcmp(k[i].key, k[i - 1].key, k[i].len) == 0) {
      const char *nm = t[k[i].idx].name;
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s' is given twice",
                   sd_msgstr(shown, sizeof shown, nm, name_len[k[i].idx]));
      goto out;
    }
    ord[i] = k[i].idx;
  }
  if (any_index && !by_pos) {
    for (size_t i = 0; i < n; i++) {
      unsigned char *kb = pos_keys + 8 * i;
      put_position(&t[ord[i]], kb);
      k[i] = (sd_skey){kb, 8, ord[i]};
    }
    if (sd_sort_keys_in(k, n, sort_tmp, sd_sort_keys_scratch(n))) goto oom;
    for (size_t i = 0; i < n; i++) ord[i] = k[i].idx;
  }
  goto out;
oom:
  rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory ordering %zu tensors", n);
out:
  free(own);
  return rc;
}

/* The reference writer's order inside a file: larger elements first, then
 * name bytes (strcmp). */
static int header_order(sd_plan_file *pf, const sd_tensor *t, const uint32_t *name_len,
                        const uint8_t *esz, sd_skey *k, void *scratch, size_t scratch_size) {
  size_t n = pf->ntensors;
  for (size_t i = 0; i < n; i++) {
    if (i + 8 < n) {
      __builtin_prefetch(&t[pf->tensors[i + 8]].name);
      __builtin_prefetch(&name_len[pf->tensors[i + 8]]);
    }
    uint32_t ti = pf->tensors[i];
    k[i] = (sd_skey){(const unsigned char *)t[ti].name, name_len[ti], ti};
  }
  /* Natural order and byte order agree unless digit runs of different
   * lengths meet (layers.9 / layers.10), so this is usually one or a few
   * sorted runs, which the sort merely checks or merges. */
  if (sd_sort_keys_in(k, n, scratch, scratch_size)) return SHARDD_E_NO_MEMORY;
  /* Stable bucketing by element size (8, 4, 2, 1); len is free for it now. */
  size_t at[9] = {0};
  for (size_t i = 0; i < n; i++) {
    k[i].len = esz[k[i].idx];
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
 * Validation: one pass over each name finds its length, whether it needs
 * the full check (controls, non-ASCII, length, the reserved name) and how
 * many bytes JSON escapes, eight bytes at a time.
 * ------------------------------------------------------------------------ */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* High bit set exactly in the zero bytes of w (no borrow across bytes). */
static inline uint64_t zero_bytes(uint64_t w) {
  return ~(((w & ~HIGHS) + ~HIGHS) | w) & HIGHS;
}

/* 0 and *esc set, or 1 when the name needs sd_name_check's verdict. */
static int name_scan(const char *name, size_t len, uint32_t *esc) {
  const unsigned char *u = (const unsigned char *)name;
  uint64_t bad = 0, high = 0;
  unsigned e = 0;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, u + i, 8);
    high |= w;
    bad |= zero_bytes(w ^ (ONES * 0x7F)) | ((w - ONES * 0x20) & ~w & HIGHS);
    uint64_t q = zero_bytes(w ^ (ONES * '"')) | zero_bytes(w ^ (ONES * '\\'));
    if (q) e += (unsigned)__builtin_popcountll(q);
  }
  for (; i < len; i++) {
    unsigned char c = u[i];
    high |= c;
    bad |= c < 0x20 || c == 0x7F;
    e += c == '"' || c == '\\';
  }
  *esc = e;
  if (bad || len == 0 || len > SD_NAME_MAX) return 1;
  if ((high & HIGHS) && !sd_utf8_valid(name, len, NULL)) return 1;
  return len == 12 && memcmp(name, "__metadata__", 12) == 0;
}

/* ------------------------------------------------------------------------ *
 * Plan
 * ------------------------------------------------------------------------ */
int sd_plan_build(sd_plan *p, const sd_tensor *tensors, size_t n, const sd_plan_opts *opts,
                  sd_error *err) {
  char shown[SD_MSGNAME_MAX];
  static const sd_plan_opts defaults = {0};
  int rc = 0;
  uint64_t *nbytes = NULL;
  uint32_t *name_len = NULL;
  uint8_t *esz = NULL;
  sd_buf meta = {0}, meta_sum = {0};
  char *block = NULL;

  memset(p, 0, sizeof *p);
  if (!opts) opts = &defaults;
  uint64_t max = opts->max_shard_size ? opts->max_shard_size : SD_DEFAULT_MAX_SHARD_SIZE;
  const char *prefix = opts->prefix ? opts->prefix : SD_DEFAULT_PREFIX;
  if ((rc = sd_prefix_check(prefix, err))) return rc;
  if (n >= (1u << 28)) /* the name sort's limit; far beyond any header limit anyway */
    return sd_fail(err, SHARDD_E_LIMIT, "%zu tensors is more than a checkpoint can hold", n);
  if (n && !tensors) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensors are missing");

  size_t alloc_n = n ? n : 1;
  nbytes = sd_big_alloc(alloc_n * sizeof *nbytes);
  name_len = sd_big_alloc(alloc_n * sizeof *name_len);
  esz = sd_big_alloc(alloc_n);
  if (!nbytes || !name_len || !esz) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu tensors", n);
    goto fail;
  }
  p->ntensors = n;

  /* Validate every tensor, total the sizes and bound the headers' size. */
  int any_index = 0;
  size_t entry_bytes = 0, n_over = 0;
  uint64_t small_bytes = 0;
  for (size_t i = 0; i < n; i++) {
    const sd_tensor *t = &tensors[i];
    size_t len = t->name ? strlen(t->name) : 0;
    uint32_t esc = 0;
    if ((!t->name || name_scan(t->name, len, &esc)) && (rc = sd_name_check(t->name, len, err)))
      goto fail;
    name_len[i] = (uint32_t)len;
    if ((rc = sd_tensor_nbytes(t, &nbytes[i], err))) goto fail;
    if (__builtin_add_overflow(p->total_size, nbytes[i], &p->total_size) ||
        p->total_size > (uint64_t)INT64_MAX - SD_HEADER_MAX - SD_HEADER_ALIGN) {
      rc = sd_fail(err, SHARDD_E_LIMIT, "tensor '%s': the checkpoint's total size overflows",
                   sd_msgstr(shown, sizeof shown, t->name, len));
      goto fail;
    }
    esz[i] = (uint8_t)sd_dtype_size(t->dtype);
    /* nbytes is numel * element size exactly (0 with a zero dimension). */
    p->total_parameters += nbytes[i] / esz[i]; /* <= total_size: no overflow */
    if (t->index >= 0) any_index = 1;
    entry_bytes += sd_header_entry_max(t, len + 2 + esc);
    if (nbytes[i] > max)
      n_over++;
    else
      small_bytes += nbytes[i];
  }
  if (opts->has_total_parameters) {
    if (opts->total_parameters > p->total_parameters) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "total_parameters %llu is more than the %llu elements of the tensors saved",
                   (unsigned long long)opts->total_parameters, (unsigned long long)p->total_parameters);
      goto fail;
    }
    p->total_parameters = opts->total_parameters;
  }
  /* The metadata's size is needed now, its verdict only after the walk's,
   * which reports duplicate names first. */
  sd_error meta_err = {0};
  int meta_rc =
      sd_header_meta_json(opts->metadata, opts->metadata ? opts->nmetadata : 0, &meta, &meta_err);
  /* A single file carries its own checksum; which case this is shows after the split. */
  size_t sum_at = 0;
  if (!meta_rc && opts->checksums)
    meta_rc = sd_header_meta_json_sum(opts->metadata, opts->metadata ? opts->nmetadata : 0, &meta_sum, &sum_at,
                                      &meta_err);

  /* One block holds every header and then the locations in the end: a few
   * huge pages rather than thousands of separately faulted buffers. Until
   * then it is the scratch of the name sort, the split and the per-file
   * sorts, so that memory is faulted in once, not twice. It has room for
   * all of those but the natural keys by construction (a header entry
   * takes 89 bytes or more, the scratch 72 per tensor). The file count is
   * bounded here: an oversize tensor is a file of its own, and any two
   * consecutive other files hold more than max between them. A bound so
   * loose it would reserve absurd room (huge metadata, tiny max) is cut,
   * and the block grows after the split if needed. */
  size_t file_bytes = sd_header_file_max(meta.len > meta_sum.len ? meta.len : meta_sum.len);
  size_t files_guess = n ? n_over + 2 * (size_t)(small_bytes / max) + 2 : 1;
  if (n && files_guess > n) files_guess = n;
  size_t files_cap = (entry_bytes + (64u << 20)) / file_bytes;
  if (files_cap < 16) files_cap = 16;
  if (files_guess > files_cap) files_guess = files_cap;
  size_t loc_at = (entry_bytes + files_guess * file_bytes + 7) & ~(size_t)7;
  size_t block_size = loc_at + alloc_n * sizeof *p->loc;
  if (block_size < walk_scratch_min(n) + 8 * alloc_n + 8)
    block_size = walk_scratch_min(n) + 8 * alloc_n + 8;
  block = sd_big_alloc(block_size);
  if (!block) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu tensors", n);
    goto fail;
  }
  /* The walk order lives at the very end, where the locations go later. */
  size_t walk_space = (block_size - 4 * alloc_n) & ~(size_t)7;
  uint32_t *ord = (uint32_t *)(block + block_size - 4 * alloc_n);
  if ((rc = walk_order(tensors, name_len, n, any_index, opts->names_unique, ord, (unsigned char *)block, walk_space,
                       err)))
    goto fail;
  if (meta_rc) {
    if (err) *err = meta_err;
    rc = meta_rc;
    goto fail;
  }

  /* The split's work arrays: 8n + 4 bytes of the block. */
  uint32_t *shard_of = (uint32_t *)block, *group_final = shard_of + alloc_n;
  series_split ss = {.prefix = {prefix}, .nseries = 1};
  if ((rc = split_series(tensors, ord, n, nbytes, max, shard_of, group_final, &ss, err))) goto fail;
  size_t nfiles = ss.nfiles;
  p->files = calloc(nfiles, sizeof *p->files);
  if (!p->files) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
    goto fail;
  }
  p->nfiles = nfiles;
  for (size_t i = 0; i < n; i++) p->files[shard_of[i]].ntensors++;
  for (size_t f = 0, s = 0; f < nfiles; f++) {
    while (f >= ss.first_file[s] + ss.files[s]) s++;
    sd_plan_file *pf = &p->files[f];
    pf->name = ss.files[s] == 1 ? str_printf("%s.safetensors", ss.prefix[s])
                                : str_printf("%s-%05u-of-%05u.safetensors", ss.prefix[s],
                                             (unsigned)(f - ss.first_file[s]) + 1, (unsigned)ss.files[s]);
    pf->tensors = malloc((pf->ntensors ? pf->ntensors : 1) * sizeof *pf->tensors);
    if (!pf->name || !pf->tensors) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning %zu files", nfiles);
      goto fail;
    }
    pf->ntensors = 0;
  }
  if (ss.nseries > 1 && (rc = names_distinct(p, err))) goto fail;
  for (size_t i = 0; i < n; i++) {
    sd_plan_file *pf = &p->files[shard_of[i]];
    pf->tensors[pf->ntensors++] = ord[i];
  }

  size_t need_at = (entry_bytes + nfiles * file_bytes + 7) & ~(size_t)7;
  if (need_at > loc_at) {
    /* realloc keeps the pages already faulted in (mremap at this size). */
    loc_at = need_at;
    char *grown = realloc(block, loc_at + alloc_n * sizeof *p->loc);
    if (!grown) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory encoding %zu headers", nfiles);
      goto fail;
    }
    block = grown;
  }
  p->headers = block;
  p->loc = (sd_plan_loc *)(block + loc_at);
  block = NULL;
  char *at = p->headers;
  /* Each file is ordered right before it is encoded, while its tensors'
   * records and names are still in cache. The order's keys and sort space
   * (64 bytes a tensor) sit where this file's header is about to go: at
   * least 89 bytes a tensor are reserved there, and the keys are done
   * with before the header overwrites them. */
  for (size_t f = 0; f < nfiles; f++) {
    sd_skey *hk = (sd_skey *)at;
    size_t cnt = p->files[f].ntensors;
    if (header_order(&p->files[f], tensors, name_len, esz, hk, hk + cnt,
                     sd_sort_keys_scratch(cnt))) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory ordering %s", p->files[f].name);
      goto fail;
    }
    const sd_buf *m = nfiles == 1 && opts->checksums ? &meta_sum : &meta;
    if ((rc = sd_header_encode(&p->files[f], (uint32_t)f, tensors, nbytes, name_len, m->p, m->len, at, p->loc,
                               err)))
      goto fail;
    if (m == &meta_sum) p->files[f].sum_at = 8 + sum_at;
    at += p->files[f].header_size;
  }

  p->needs_index = nfiles > 1;
  p->checksums = opts->checksums != 0;
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
  free(block);
  free(meta.p);
  free(meta_sum.p);
  free(nbytes);
  free(name_len);
  free(esz);
  return rc;
}
