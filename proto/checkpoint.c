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

#include <jansson.h>

#include "sd_checksum.h"
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

static int index_metadata(const char *label, json_t *meta, sd_st_index *ix, sd_error *err) {
  if (!json_is_object(meta))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: metadata is not an object", label);
  json_t *ts = json_object_get(meta, "total_size");
  if (!ts) return sd_fail(err, SHARDD_E_FORMAT, "%s: metadata.total_size is missing", label);
  if (!json_is_integer(ts) || json_integer_value(ts) < 0)
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: metadata.total_size is not a non-negative integer", label);
  ix->total_size = (uint64_t)json_integer_value(ts);
  json_t *tp = json_object_get(meta, "total_parameters");
  if (tp) {
    if (!json_is_integer(tp) || json_integer_value(tp) < 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: metadata.total_parameters is not a non-negative integer", label);
    ix->has_total_parameters = 1;
    ix->total_parameters = (uint64_t)json_integer_value(tp);
  }
  return 0;
}

static int index_weight_map(const char *label, json_t *wm, sd_st_index *ix, sd_error *err) {
  if (!json_is_object(wm))
    return sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map is not an object", label);
  size_t n = json_object_size(wm);
  if (n == 0) return sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map is empty", label);
  ix->entries = calloc(n, sizeof *ix->entries);
  char **files = calloc(n, sizeof *files); /* borrowed from the JSON until deduplicated */
  if (!ix->entries || !files) {
    free(files);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  }
  const char *k;
  json_t *v;
  size_t i = 0;
  char kb[SD_MSGNAME_MAX], fb[SD_MSGNAME_MAX];
  json_object_foreach(wm, k, v) {
    const char *f = json_string_value(v);
    if (!f) {
      free(files);
      return sd_fail(err, SHARDD_E_FORMAT, "%s: weight_map: tensor '%s' -> not a string", label,
                     SHOW(kb, k));
    }
    if (!ends_with(f, ST_SUFFIX) || strchr(f, '/') || strlen(f) == strlen(ST_SUFFIX)) {
      free(files);
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: weight_map: tensor '%s' -> '%s' is not a plain *.safetensors file name",
                     label, SHOW(kb, k), SHOW(fb, f));
    }
    files[i++] = (char *)f;
  }
  qsort(files, n, sizeof *files, cmp_str);
  size_t nf = 0;
  for (i = 0; i < n; i++)
    if (nf == 0 || strcmp(files[nf - 1], files[i]) != 0) files[nf++] = files[i];
  ix->files = calloc(nf, sizeof *ix->files);
  if (!ix->files) {
    free(files);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  }
  for (i = 0; i < nf; i++) {
    if (!(ix->files[i] = strdup(files[i]))) {
      ix->nfiles = i;
      free(files);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    }
  }
  ix->nfiles = nf;
  free(files);
  json_object_foreach(wm, k, v) {
    sd_st_index_entry *e = &ix->entries[ix->nentries];
    e->file = (uint32_t)find_name(ix->files, ix->nfiles, json_string_value(v));
    if (!(e->tensor = strdup(k)))
      return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
    ix->nentries++;
  }
  qsort(ix->entries, ix->nentries, sizeof *ix->entries, cmp_entry);
  return 0;
}

/* metadata's checksums, read once the weight_map has named the files: the
 * daemon records every file's or none, so a file left out, a name the
 * weight_map does not know, or a value that is not 8 hex digits is damage
 * (or an edit), not something to skip. */
static int index_checksums(const char *label, json_t *meta, sd_st_index *ix, sd_error *err) {
  json_t *sums = json_object_get(meta, SD_CHECKSUM_KEY);
  if (!sums) return 0;
  if (!json_is_object(sums))
    return sd_fail(err, SHARDD_E_FORMAT,
                   "%s: metadata." SD_CHECKSUM_KEY " is not an object of file names", label);
  ix->crcs = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *ix->crcs);
  if (!ix->crcs) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory", label);
  const char *k;
  json_t *v;
  char kb[SD_MSGNAME_MAX], vb[SD_MSGNAME_MAX];
  json_object_foreach(sums, k, v) {
    ssize_t f = find_name(ix->files, ix->nfiles, k);
    if (f < 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: metadata." SD_CHECKSUM_KEY " names %s, which the weight_map does not",
                     label, SHOW(kb, k));
    const char *hex = json_string_value(v);
    if (!hex || sd_crc32c_parse(hex, &ix->crcs[f]) != 0)
      return sd_fail(err, SHARDD_E_FORMAT,
                     "%s: metadata." SD_CHECKSUM_KEY ": %s -> %s%s%s is not %d hex digits", label,
                     SHOW(kb, k), hex ? "'" : "", hex ? SHOW(vb, hex) : "a non-string",
                     hex ? "'" : "", SD_CHECKSUM_HEX);
  }
  if (json_object_size(sums) != ix->nfiles) {
    for (size_t i = 0; i < ix->nfiles; i++)
      if (!json_object_get(sums, ix->files[i]))
        return sd_fail(err, SHARDD_E_FORMAT,
                       "%s: metadata." SD_CHECKSUM_KEY " records no checksum for %s", label,
                       SHOW(kb, ix->files[i]));
  }
  return 0;
}

int sd_st_index_parse(const char *label, const char *json, size_t len, sd_st_index *ix,
                      sd_error *err) {
  memset(ix, 0, sizeof *ix);
  json_error_t je;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return sd_fail(err, SHARDD_E_FORMAT, "%s: not valid JSON at byte %d: %s%s", label,
                   je.position, je.text,
                   json_error_code(&je) == json_error_invalid_utf8 ? " (invalid UTF-8)" : "");
  int rc = 0;
  if (!json_is_object(root)) {
    rc = sd_fail(err, SHARDD_E_FORMAT, "%s: not a JSON object", label);
    goto out;
  }
  const char *k;
  json_t *v;
  char kb[SD_MSGNAME_MAX];
  json_object_foreach(root, k, v) {
    if (strcmp(k, "metadata") && strcmp(k, "weight_map")) {
      rc = sd_fail(err, SHARDD_E_FORMAT, "%s: unexpected top-level key '%s'", label, SHOW(kb, k));
      goto out;
    }
  }
  json_t *meta = json_object_get(root, "metadata");
  json_t *wm = json_object_get(root, "weight_map");
  if (!meta || !wm) {
    rc = sd_fail(err, SHARDD_E_FORMAT, "%s: missing '%s'", label, !meta ? "metadata" : "weight_map");
    goto out;
  }
  if ((rc = index_metadata(label, meta, ix, err)) != 0) goto out;
  if ((rc = index_weight_map(label, wm, ix, err)) != 0) goto out;
  rc = index_checksums(label, meta, ix, err);
out:
  json_decref(root);
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
