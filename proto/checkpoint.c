/* Strict checks of a checkpoint folder: the index, the shards it names, and that the two agree exactly. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_checksum.h"
#include "sd_jscan.h"
#include "sd_nameidx.h"
#include "sd_layout.h"
#include "sd_grow.h"
#include "sd_reader.h"

/* Names inside messages are cut and cleaned (see reader.c). */
#define SHOW(buf, s) sd_msgstr(buf, sizeof buf, s, strlen(s))

#define ST_SUFFIX ".safetensors"
#define INDEX_SUFFIX ".safetensors.index.json"
/* An index for millions of tensors is tens of MB; this bound only keeps a
 * hostile file from exhausting memory. */
#define INDEX_MAX (1ULL << 30)

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && memcmp(s + n - m, suf, m) == 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const sd_st_index_entry *)a)->tensor, ((const sd_st_index_entry *)b)->tensor);
}

static const sd_st_index_entry *find_entry(const sd_st_index *ix, const char *name) {
  sd_st_index_entry key = {.tensor = (char *)name, .file = 0};
  return bsearch(&key, ix->entries, ix->nentries, sizeof key, cmp_entry);
}

static ssize_t find_name(char *const *names, size_t n, const char *name) {
  char *const *p = bsearch(&name, names, n, sizeof *names, cmp_str);
  return p ? p - names : -1;
}

static void free_names(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* ------------------------------------------------------------------------ *
 * The index, pure
 * ------------------------------------------------------------------------ */

void sd_st_index_free(sd_st_index *ix) {
  if (!ix) return;
  for (size_t i = 0; i < ix->nentries; i++) free(ix->entries[i].tensor);
  free(ix->entries);
  free_names(ix->files, ix->nfiles);
  free(ix->crcs);
  memset(ix, 0, sizeof *ix);
}

static int dup_key(const char *label, size_t at, const char *key, sd_error *err) {
  char kb[SD_MSGNAME_MAX];
  return sd_fail(err, SHARDD_E_FORMAT, "%s: not valid JSON at byte %zu: duplicate object key '%s'", label, at,
                 SHOW(kb, key));
}

/* An object's members whose keys are in `keys` are left at their values in `at`, found[i] set; the
 * others are walked past, or refused when `others` names what they are ("top-level key"). No key
 * may come twice, at this level or in any object walked past (jansson's loader refused both). */
static int pick_members(const char *label, sd_jcur *c, const char *const *keys, size_t nkeys, sd_jcur *at,
                        int *found, const char *others, sd_error *err) {
  sd_jkeys seen;
  sd_jkeys_init(&seen);
  int rc = 0;
  sd_jcur_enter(c);
  while (!rc && sd_jcur_more(c)) {
    size_t kat = sd_jcur_at(c);
    const char *k;
    int added = sd_jkeys_read(&seen, c, &k);
    if (added < 0) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    size_t i = 0;
    while (i < nkeys && strcmp(k, keys[i])) i++;
    if (i == nkeys && others) {
      char kb[SD_MSGNAME_MAX];
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: unexpected %s '%s'", label, others, SHOW(kb, k));
      break;
    }
    if (added) {
      rc = dup_key(label, kat, k, err);
      break;
    }
    if (i < nkeys) {
      found[i] = 1;
      sd_jcur_peek(c);
      at[i] = *c;
      sd_jcur_skip(c); /* read by the caller, which refuses what it does not expect */
      continue;
    }
    char *dup = NULL;
    size_t dat = 0;
    int u = sd_jcur_skip_unique(c, &dup, &dat);
    if (u) rc = u < 0 ? sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label) : dup_key(label, dat, dup, err);
    free(dup);
  }
  sd_jkeys_free(&seen);
  return rc;
}

/* A non-negative integer at c: 0, or -1 when it is anything else. */
static int index_u64(sd_jcur *c, uint64_t *out) {
  char k = sd_jcur_peek(c);
  int64_t v = 0;
  if (!(k == '-' || (k >= '0' && k <= '9')) || !sd_jcur_number(c, &v) || v < 0) return -1;
  *out = (uint64_t)v;
  return 0;
}

enum { M_TOTAL, M_PARAMS, M_SUMS, M_N };

static int index_metadata(const char *label, sd_jcur *meta, sd_st_index *ix, sd_jcur *sums, int *has_sums,
                          sd_error *err) {
  if (sd_jcur_peek(meta) != '{')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: metadata is not an object", label);
  static const char *const keys[M_N] = {"total_size", "total_parameters", SD_CHECKSUM_KEY};
  sd_jcur at[M_N];
  int found[M_N] = {0};
  int rc = pick_members(label, meta, keys, M_N, at, found, NULL, err);
  if (rc) return rc;
  if (!found[M_TOTAL]) return sd_fail(err, SHARDD_E_FORMAT, "%s: metadata.total_size is missing", label);
  if (index_u64(&at[M_TOTAL], &ix->total_size) != 0)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: metadata.total_size is not a non-negative integer", label);
  if (found[M_PARAMS]) {
    if (index_u64(&at[M_PARAMS], &ix->total_parameters) != 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: metadata.total_parameters is not a non-negative integer", label);
    ix->has_total_parameters = 1;
  }
  *has_sums = found[M_SUMS];
  if (found[M_SUMS]) *sums = at[M_SUMS];
  return 0;
}

static const char *entry_name(const void *ctx, uint32_t i) { return ((const sd_st_index *)ctx)->entries[i].tensor; }
static const char *file_name(const void *ctx, uint32_t i) { return ((char *const *)ctx)[i]; }

static int cmp_file_at(const void *a, const void *b, void *files) {
  return strcmp(((char **)files)[*(const uint32_t *)a], ((char **)files)[*(const uint32_t *)b]);
}

/* The files in first-seen order sorted into ix->files; the entries' indices follow. */
static int sort_files(const char *label, sd_st_index *ix, char **seen, size_t nf, sd_error *err) {
  uint32_t *order = malloc(nf * sizeof *order), *where = malloc(nf * sizeof *where);
  ix->files = calloc(nf, sizeof *ix->files);
  if (!order || !where || !ix->files) {
    free(order);
    free(where);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  }
  for (uint32_t i = 0; i < nf; i++) order[i] = i;
  qsort_r(order, nf, sizeof *order, cmp_file_at, seen);
  for (uint32_t i = 0; i < nf; i++) {
    ix->files[i] = seen[order[i]];
    where[order[i]] = i;
  }
  ix->nfiles = nf;
  for (size_t i = 0; i < ix->nentries; i++) ix->entries[i].file = where[ix->entries[i].file];
  free(order);
  free(where);
  return 0;
}

static int index_weight_map(const char *label, sd_jcur *wm, sd_st_index *ix, sd_error *err) {
  if (sd_jcur_peek(wm) != '{')
    return sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map is not an object", label);
  sd_nameidx tensors, files;
  sd_nameidx_init(&tensors);
  sd_nameidx_init(&files);
  char **seen = NULL; /* distinct file names, in first-seen order */
  size_t nseen = 0, seen_cap = 0, ecap = 0;
  char kb[SD_MSGNAME_MAX], fb[SD_MSGNAME_MAX];
  int rc = 0;
  sd_jcur_enter(wm);
  while (!rc && sd_jcur_more(wm)) {
    size_t kat = sd_jcur_at(wm);
    char *k = sd_jcur_key(wm);
    char *f = NULL;
    if (!k || SD_GROW(ix->entries, ecap, ix->nentries + 1, 64)) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    } else if (sd_nameidx_find(&tensors, k, entry_name, ix) != SD_NAMEIDX_NONE) {
      rc = dup_key(label, kat, k, err);
    } else if (sd_jcur_peek(wm) != '"') {
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map: tensor '%s' -> not a string", label, SHOW(kb, k));
    } else if (!(f = malloc(sd_jcur_strmax(wm) + 1))) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    } else if ((sd_jcur_string(wm, f), !ends_with(f, ST_SUFFIX) || strchr(f, '/') || strlen(f) == strlen(ST_SUFFIX))) {
      rc = sd_fail(err, SHARDD_E_FORMAT,
                   "%s: weight_map: tensor '%s' -> '%s' is not a plain *.safetensors file name", label,
                   SHOW(kb, k), SHOW(fb, f));
    }
    if (rc) {
      free(k);
      free(f);
      break;
    }
    uint32_t fi = sd_nameidx_find(&files, f, file_name, seen);
    if (fi == SD_NAMEIDX_NONE) {
      if (SD_GROW(seen, seen_cap, nseen + 1, 16) || sd_nameidx_insert(&files, f, (uint32_t)nseen, file_name, seen)) {
        free(k);
        free(f);
        rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
        break;
      }
      fi = (uint32_t)nseen;
      seen[nseen++] = f;
    } else {
      free(f);
    }
    ix->entries[ix->nentries] = (sd_st_index_entry){k, fi};
    if (sd_nameidx_insert(&tensors, k, (uint32_t)ix->nentries, entry_name, ix) != 0) {
      free(k);
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    ix->nentries++;
  }
  sd_nameidx_free(&tensors);
  sd_nameidx_free(&files);
  if (!rc && ix->nentries == 0) rc = sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map is empty", label);
  if (!rc) rc = sort_files(label, ix, seen, nseen, err);
  if (rc) free_names(seen, nseen);
  else free(seen);
  if (!rc) qsort(ix->entries, ix->nentries, sizeof *ix->entries, cmp_entry);
  return rc;
}

/* metadata's checksums, read once the weight_map has named the files, in
 * one pass: the daemon records every file's or none, so a name the
 * weight_map does not know (refused at the first), a file left out, or a
 * value that is not 8 hex digits is damage (or an edit), not something to skip. */
static int index_checksums(const char *label, sd_jcur *sums, sd_st_index *ix, sd_error *err) {
  if (sd_jcur_peek(sums) != '{')
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: metadata." SD_CHECKSUM_KEY " is not an object of file names", label);
  ix->crcs = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *ix->crcs);
  uint8_t *got = calloc(ix->nfiles ? ix->nfiles : 1, 1);
  if (!ix->crcs || !got) {
    free(got);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  }
  char kb[SD_MSGNAME_MAX], vb[SD_MSGNAME_MAX];
  int rc = 0;
  size_t ngot = 0;
  sd_jcur_enter(sums);
  while (!rc && sd_jcur_more(sums)) {
    size_t kat = sd_jcur_at(sums);
    char *k = sd_jcur_key(sums);
    if (!k) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
      break;
    }
    ssize_t f = find_name(ix->files, ix->nfiles, k);
    char hex[SD_CHECKSUM_HEX + 2] = "";
    int is_str = sd_jcur_peek(sums) == '"', fits = is_str && sd_jcur_strmax(sums) < sizeof hex;
    if (fits) sd_jcur_string(sums, hex);
    else sd_jcur_skip(sums);
    if (f < 0)
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: metadata." SD_CHECKSUM_KEY " names %s, which the weight_map does not",
                   label, SHOW(kb, k));
    else if (got[f])
      rc = dup_key(label, kat, k, err);
    else if (!fits || sd_crc32c_parse(hex, &ix->crcs[f]) != 0)
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: metadata." SD_CHECKSUM_KEY ": %s -> %s%s%s is not %d hex digits",
                   label, SHOW(kb, k), is_str ? "'" : "", is_str ? (fits ? SHOW(vb, hex) : "(a longer string)")
                   : "a non-string", is_str ? "'" : "", SD_CHECKSUM_HEX);
    if (!rc) {
      got[f] = 1;
      ngot++;
    }
    free(k);
  }
  for (size_t i = 0; !rc && ngot != ix->nfiles && i < ix->nfiles; i++)
    if (!got[i])
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: metadata." SD_CHECKSUM_KEY " records no checksum for %s", label,
                   SHOW(kb, ix->files[i]));
  free(got);
  return rc;
}

enum { T_META, T_WM, T_N };

int sd_st_index_parse(const char *label, const char *json, size_t len, sd_st_index *ix,
                      sd_error *err) {
  memset(ix, 0, sizeof *ix);
  size_t at;
  const char *why;
  int utf8;
  if (sd_json_check(json, len, &at, &why, &utf8) != 0)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: not valid JSON at byte %zu: %s%s", label, at, why,
                   utf8 ? " (invalid UTF-8)" : "");
  sd_jcur c;
  sd_jcur_init(&c, json, len);
  if (sd_jcur_peek(&c) != '{') return sd_fail(err, SHARDD_E_FORMAT, "%s: not a JSON object", label);
  static const char *const keys[T_N] = {"metadata", "weight_map"};
  sd_jcur top[T_N], sums;
  int found[T_N] = {0}, has_sums = 0;
  int rc = pick_members(label, &c, keys, T_N, top, found, "top-level key", err);
  if (!rc && (!found[T_META] || !found[T_WM]))
    rc = sd_fail(err, SHARDD_E_FORMAT, "%s: missing '%s'", label, !found[T_META] ? "metadata" : "weight_map");
  if (!rc) rc = index_metadata(label, &top[T_META], ix, &sums, &has_sums, err);
  if (!rc) rc = index_weight_map(label, &top[T_WM], ix, err);
  if (!rc && has_sums) rc = index_checksums(label, &sums, ix, err);
  if (rc) sd_st_index_free(ix);
  return rc;
}

int sd_st_index_check(const char *label, const sd_st_index *ix, const sd_ckpt_file *files,
                      sd_error *err) {
  uint8_t *seen = calloc(ix->nentries ? ix->nentries : 1, 1);
  if (!seen) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  int rc = 0;
  uint64_t bytes = 0, params = 0;
  for (size_t f = 0; f < ix->nfiles; f++) {
    const sd_st_header *h = &files[f].h;
    for (size_t t = 0; t < h->ntensors; t++) {
      const char *raw = h->tensors[t].name;
      char name[SD_MSGNAME_MAX], fb[SD_MSGNAME_MAX];
      SHOW(name, raw);
      const sd_st_index_entry *e = find_entry(ix, raw);
      if (!e) {
        rc = sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s' is in %s but not in weight_map",
                     label, name, files[f].name);
        goto out;
      }
      if (e->file != f) {
        if (sd_st_find(&files[e->file].h, raw))
          rc = sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s' is in both %s and %s", label, name,
                       files[e->file].name, files[f].name);
        else
          rc = sd_fail(err, SHARDD_E_FORMAT, "%s: tensor '%s' is in %s but weight_map says %s",
                       label, name, files[f].name, SHOW(fb, ix->files[e->file]));
        goto out;
      }
      seen[e - ix->entries] = 1;
      bytes += h->tensors[t].end - h->tensors[t].begin;
      params += h->tensors[t].numel;
    }
  }
  for (size_t i = 0; i < ix->nentries; i++) {
    if (!seen[i]) {
      char name[SD_MSGNAME_MAX], fb[SD_MSGNAME_MAX];
      rc = sd_fail(err, SHARDD_E_FORMAT,
                   "%s: weight_map says tensor '%s' is in %s, which has no such tensor", label,
                   SHOW(name, ix->entries[i].tensor), SHOW(fb, ix->files[ix->entries[i].file]));
      goto out;
    }
  }
  if (bytes != ix->total_size) {
    rc = sd_fail(err, SHARDD_E_FORMAT,
                 "%s: metadata.total_size is %" PRIu64 " but the tensors hold %" PRIu64 " bytes",
                 label, ix->total_size, bytes);
    goto out;
  }
  /* At most what the tensors hold: transformers' save_pretrained writes num_parameters(), which
   * leaves out persistent buffers (DeepSeek-V3's e_score_correction_bias). */
  if (ix->has_total_parameters && params < ix->total_parameters)
    rc = sd_fail(err, SHARDD_E_FORMAT,
                 "%s: metadata.total_parameters is %" PRIu64 " but the tensors hold only %" PRIu64
                 " parameters",
                 label, ix->total_parameters, params);
out:
  free(seen);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * The folder
 * ------------------------------------------------------------------------ */

void sd_ckpt_free(sd_ckpt *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nfiles; i++) {
    free(c->files[i].name);
    sd_st_header_free(&c->files[i].h);
  }
  free(c->files);
  free(c->index_name);
  free(c->prefix);
  memset(c, 0, sizeof *c);
}

typedef struct {
  char **v;
  size_t n, cap;
} names_t;

static int names_push(names_t *a, const char *s) {
  if (SD_GROW(a->v, a->cap, a->n + 1, 16)) return -1;
  if (!(a->v[a->n] = strdup(s))) return -1;
  a->n++;
  return 0;
}

/* Names of the folder's *.safetensors files and index files, sorted. */
static int list_dir(int dfd, names_t *shards, names_t *indexes, sd_error *err) {
  int fd2 = dup(dfd);
  DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
  if (!d) {
    if (fd2 >= 0) close(fd2);
    return sd_fail(err, SHARDD_E_IO, "cannot list the folder: %s", strerror(errno));
  }
  struct dirent *de;
  int rc = 0;
  errno = 0;
  while ((de = readdir(d)) != NULL) {
    int r = 0;
    if (ends_with(de->d_name, INDEX_SUFFIX)) r = names_push(indexes, de->d_name);
    else if (ends_with(de->d_name, ST_SUFFIX)) r = names_push(shards, de->d_name);
    if (r) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory listing the folder");
      break;
    }
    errno = 0;
  }
  if (!rc && errno) rc = sd_fail(err, SHARDD_E_IO, "cannot list the folder: %s", strerror(errno));
  closedir(d);
  if (shards->n) qsort(shards->v, shards->n, sizeof *shards->v, cmp_str);
  if (indexes->n) qsort(indexes->v, indexes->n, sizeof *indexes->v, cmp_str);
  return rc;
}

static int read_text(int dfd, const char *name, char **out, size_t *len, sd_error *err) {
  struct stat st;
  int fd = sd_open_regular(dfd, name, name, &st, err);
  if (fd < 0) return err->code;
  int rc = 0;
  char *buf = NULL;
  if ((uint64_t)st.st_size > INDEX_MAX) {
    rc = sd_fail(err, SHARDD_E_FORMAT, "%s: %lld bytes, over the %llu-byte limit for an index",
                 name, (long long)st.st_size, (unsigned long long)INDEX_MAX);
  } else if (!(buf = malloc((size_t)st.st_size + 1))) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", name);
  } else {
    size_t done = 0, want = (size_t)st.st_size;
    while (done < want) {
      ssize_t r = pread(fd, buf + done, want - done, (off_t)done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        rc = sd_fail(err, SHARDD_E_IO, "%s: cannot read: %s", name,
                     r == 0 ? "unexpected end of file" : strerror(errno));
        break;
      }
      done += (size_t)r;
    }
    *len = done;
  }
  close(fd);
  if (rc) free(buf);
  else *out = buf;
  return rc;
}

static int read_shards(int dfd, sd_ckpt *c, char *const *names, size_t n, sd_error *err) {
  c->files = calloc(n ? n : 1, sizeof *c->files);
  if (!c->files) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < n; i++) {
    sd_ckpt_file *f = &c->files[i];
    if (!(f->name = strdup(names[i]))) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    c->nfiles++;
    int rc = sd_st_read_fileat(dfd, names[i], names[i], &f->h, err);
    if (rc) return rc;
  }
  return 0;
}

/* huggingface_hub's shard name, PREFIX-NNNNN-of-NNNNN.safetensors (five digits or more each, as
 * "{:05d}" gives past 99,999 shards); *plen gets PREFIX's length. */
static int shard_pattern(const char *name, size_t *plen) {
  if (!ends_with(name, ST_SUFFIX)) return 0;
  const char *p = name + strlen(name) - strlen(ST_SUFFIX);
  for (int part = 0; part < 2; part++) {
    const char *end = p;
    while (p > name && p[-1] >= '0' && p[-1] <= '9') p--;
    if (end - p < 5) return 0;
    const char *sep = part == 0 ? "-of-" : "-";
    size_t k = strlen(sep);
    if ((size_t)(p - name) < k + (part == 1) || memcmp(p - k, sep, k) != 0) return 0;
    p -= k;
  }
  *plen = (size_t)(p - name);
  return 1;
}

/* A file named like one of this checkpoint's shards that the index does not name is stale (an older
 * save's) or foreign (copied in): loaders that follow the index would ignore it silently, and ones that
 * glob the folder would mix it in. Other files (config.json, another prefix's weights) are normal. */
static int is_prefix_shard(const char *prefix, const char *name) {
  size_t p = strlen(prefix), plen;
  if (strncmp(name, prefix, p) != 0) return 0;
  return strcmp(name + p, ST_SUFFIX) == 0 || (shard_pattern(name, &plen) && plen == p);
}

/* Without an index, a file with a shard's name is one of a set whose index is gone, or a stale
 * shard beside a single-file checkpoint. */
static int check_unindexed(const names_t *shards, sd_error *err) {
  for (size_t i = 0; i < shards->n; i++) {
    const char *name = shards->v[i];
    size_t plen;
    if (!shard_pattern(name, &plen)) continue;
    char single[PATH_MAX], nb[SD_MSGNAME_MAX], sb[SD_MSGNAME_MAX];
    snprintf(single, sizeof single, "%.*s" ST_SUFFIX, (int)plen, name);
    if (find_name(shards->v, shards->n, single) >= 0)
      return sd_fail(err, SHARDD_E_FILE_SET, "%s: a shard file beside the single-file checkpoint %s (stale or foreign)",
                     SHOW(nb, name), SHOW(sb, single));
    snprintf(single, sizeof single, "%.*s" INDEX_SUFFIX, (int)plen, name);
    return sd_fail(err, SHARDD_E_FILE_SET, "%s: a shard of a sharded checkpoint, but %s is missing", SHOW(nb, name),
                   SHOW(sb, single));
  }
  return 0;
}

static int read_indexed(int dfd, sd_ckpt *c, const names_t *shards, sd_error *err) {
  char *json = NULL;
  size_t len = 0;
  sd_st_index ix;
  memset(&ix, 0, sizeof ix);
  int rc = read_text(dfd, c->index_name, &json, &len, err);
  if (rc) return rc;
  rc = sd_st_index_parse(c->index_name, json, len, &ix, err);
  free(json);
  if (rc) return rc;
  for (size_t i = 0; i < ix.nfiles; i++) {
    if (find_name(shards->v, shards->n, ix.files[i]) < 0) {
      char fb[SD_MSGNAME_MAX];
      rc = sd_fail(err, SHARDD_E_FILE_SET, "%s: weight_map names %s, which does not exist",
                   c->index_name, SHOW(fb, ix.files[i]));
      goto out;
    }
  }
  for (size_t i = 0; i < shards->n; i++) {
    if (is_prefix_shard(c->prefix, shards->v[i]) && find_name(ix.files, ix.nfiles, shards->v[i]) < 0) {
      char nb[SD_MSGNAME_MAX];
      rc = sd_fail(err, SHARDD_E_FILE_SET, "%s: not in the weight_map of %s (stale or foreign)",
                   SHOW(nb, shards->v[i]), c->index_name);
      goto out;
    }
  }
  if ((rc = read_shards(dfd, c, ix.files, ix.nfiles, err)) != 0) goto out;
  if ((rc = sd_st_index_check(c->index_name, &ix, c->files, err)) != 0) goto out;
  for (size_t i = 0; ix.crcs && i < ix.nfiles; i++) {
    c->files[i].has_crc = 1;
    c->files[i].crc = ix.crcs[i];
  }
out:
  sd_st_index_free(&ix);
  return rc;
}

int sd_ckpt_read(const char *dir, sd_ckpt *c, sd_error *err) {
  memset(c, 0, sizeof *c);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open the folder: %s", strerror(errno));
  names_t shards = {0}, indexes = {0};
  int rc = list_dir(dfd, &shards, &indexes, err);
  if (rc) goto out;
  if (indexes.n > 1) {
    rc = sd_fail(err, SHARDD_E_FORMAT, "%zu index files (%s, %s%s); expected one", indexes.n,
                 indexes.v[0], indexes.v[1], indexes.n > 2 ? ", ..." : "");
    goto out;
  }
  if (indexes.n == 1) {
    c->index_name = strdup(indexes.v[0]);
    c->prefix = c->index_name ? strndup(indexes.v[0], strlen(indexes.v[0]) - strlen(INDEX_SUFFIX))
                              : NULL;
    if (!c->prefix) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
      goto out;
    }
    rc = read_indexed(dfd, c, &shards, err);
  } else if ((rc = check_unindexed(&shards, err)) != 0) {
    goto out;
  } else if (shards.n != 1) {
    rc = shards.n == 0
             ? sd_fail(err, SHARDD_E_FORMAT, "no .safetensors file and no index")
             : sd_fail(err, SHARDD_E_FORMAT, "%zu .safetensors files (%s, %s%s) but no *%s",
                       shards.n, shards.v[0], shards.v[1], shards.n > 2 ? ", ..." : "",
                       INDEX_SUFFIX);
  } else {
    c->prefix = strndup(shards.v[0], strlen(shards.v[0]) - strlen(ST_SUFFIX));
    if (!c->prefix) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
      goto out;
    }
    rc = read_shards(dfd, c, shards.v, 1, err);
    if (!rc) rc = sd_st_meta_crc(c->files[0].name, &c->files[0].h, &c->files[0].has_crc,
                                 &c->files[0].crc, err);
  }
  for (size_t i = 0; !rc && i < c->nfiles; i++) {
    c->ntensors += c->files[i].h.ntensors;
    c->total_parameters += c->files[i].h.total_parameters;
    for (size_t t = 0; t < c->files[i].h.ntensors; t++)
      c->total_size += c->files[i].h.tensors[t].end - c->files[i].h.tensors[t].begin;
  }
out:
  free_names(shards.v, shards.n);
  free_names(indexes.v, indexes.n);
  close(dfd);
  if (rc) sd_ckpt_free(c);
  return rc;
}

int sd_ckpt_read_single(const char *path, sd_ckpt *c, sd_error *err) {
  memset(c, 0, sizeof *c);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  c->files = calloc(1, sizeof *c->files);
  if (!c->files || !(c->files[0].name = strdup(base))) {
    sd_ckpt_free(c);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  }
  c->nfiles = 1;
  sd_ckpt_file *f = &c->files[0];
  int rc = sd_st_read_fileat(AT_FDCWD, path, f->name, &f->h, err);
  if (!rc) rc = sd_st_meta_crc(f->name, &f->h, &f->has_crc, &f->crc, err);
  if (rc) {
    sd_ckpt_free(c);
    return rc;
  }
  c->ntensors = f->h.ntensors;
  c->total_parameters = f->h.total_parameters;
  c->total_size = f->h.data_size; /* the tensors tile the data section exactly */
  return 0;
}
