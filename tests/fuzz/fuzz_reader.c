/* libFuzzer target: bytes as a whole .safetensors file for the strict reader (and as index JSON). */
#include <jansson.h>
#include <string.h>

#include "fuzz_util.h"
#include "sd_format.h"
#include "sd_layout.h"
#include "sd_reader.h"

/* On success the parsed header must describe exactly what the format
 * allows; the reader's own promises are re-checked here from the outside. */
static void check_header(const sd_st_header *h, const uint8_t *data, size_t size) {
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = (hl << 8) | data[i];
  FUZZ_CHECK(h->header_len == hl && hl <= SD_HEADER_MAX, "header_len %llu", (unsigned long long)h->header_len);
  FUZZ_CHECK(h->data_start == 8 + hl && h->file_size == size && h->data_size == size - 8 - hl,
             "sizes do not add up");
  FUZZ_CHECK(data[8] == '{', "accepted a header not starting with '{'");
  uint64_t at = 0, params = 0;
  for (size_t i = 0; i < h->ntensors; i++) {
    const sd_st_tensor *t = &h->tensors[i];
    FUZZ_CHECK(t->name && strcmp(t->name, "__metadata__") != 0, "tensor %zu badly named", i);
    FUZZ_CHECK(sd_utf8_valid(t->name, strlen(t->name), NULL), "tensor %zu name not UTF-8", i);
    FUZZ_CHECK(t->dtype < SD_DT__COUNT && t->ndim <= SD_MAX_DIMS, "tensor '%s' type", t->name);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
      unsigned __int128 m = (unsigned __int128)numel * t->shape[d];
      FUZZ_CHECK(m <= UINT64_MAX, "tensor '%s' numel overflow accepted", t->name);
      numel = (uint64_t)m;
    }
    FUZZ_CHECK(numel == t->numel, "tensor '%s' numel %llu, expected %llu", t->name,
               (unsigned long long)t->numel, (unsigned long long)numel);
    unsigned __int128 nb = (unsigned __int128)numel * sd_dtype_size(t->dtype);
    FUZZ_CHECK(t->begin == at && t->end >= t->begin && (unsigned __int128)(t->end - t->begin) == nb,
               "tensor '%s' offsets [%llu,%llu] do not follow at %llu", t->name, (unsigned long long)t->begin,
               (unsigned long long)t->end, (unsigned long long)at);
    at = t->end;
    params += numel;
    for (size_t j = 0; j < i; j++)
      FUZZ_CHECK(strcmp(h->tensors[j].name, t->name) != 0, "tensor '%s' twice", t->name);
    FUZZ_CHECK(sd_st_find(h, t->name) == t, "sd_st_find misses '%s'", t->name);
  }
  FUZZ_CHECK(at == h->data_size, "tensors end at %llu, data is %llu bytes", (unsigned long long)at,
             (unsigned long long)h->data_size);
  FUZZ_CHECK(params == h->total_parameters, "total_parameters");
  for (size_t i = 0; i < h->nmeta; i++)
    FUZZ_CHECK(h->meta[i].key && h->meta[i].value, "metadata pair %zu", i);
}

static void check_error(const sd_error *err, int rc, const char *label) {
  FUZZ_CHECK(rc == SHARDD_E_FORMAT || rc == SHARDD_E_NO_MEMORY, "rc %d: %s", rc, err->msg);
  FUZZ_CHECK(err->code == rc, "err.code %d, rc %d", err->code, rc);
  FUZZ_CHECK(strncmp(err->msg, label, strlen(label)) == 0, "message does not start with the label: %s",
             err->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The whole buffer is the file. */
  const char *label = "fuzz.safetensors";
  sd_st_header h;
  sd_error err = {0};
  int rc = sd_st_parse(label, data, size, size, &h, &err);
  if (rc == 0) {
    check_header(&h, data, size);
  } else {
    check_error(&err, rc, label);
    FUZZ_CHECK(h.ntensors == 0 && h.tensors == NULL && h.nmeta == 0, "failure left a header behind");
  }

  /* sd_st_read_file hands over only the prefix and the JSON: the verdict
   * must not depend on whether the data section is in the buffer. */
  if (size >= 8) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | data[i];
    if (hl <= size - 8 && hl < size) {
      sd_st_header h2;
      sd_error err2 = {0};
      int rc2 = sd_st_parse(label, data, (size_t)(8 + hl), size, &h2, &err2);
      FUZZ_CHECK(rc2 == rc, "whole file rc %d, header only rc %d (%s / %s)", rc, rc2, err.msg, err2.msg);
      FUZZ_CHECK(rc || h2.ntensors == h.ntensors, "tensor count differs");
      if (rc) FUZZ_CHECK(strcmp(err.msg, err2.msg) == 0, "messages differ: %s / %s", err.msg, err2.msg);
      sd_st_header_free(&h2);
    }
  }
  sd_st_header_free(&h);

  /* The same bytes as an index file: the pure index parser. */
  sd_st_index ix;
  sd_error ierr = {0};
  rc = sd_st_index_parse("fuzz.index.json", (const char *)data, size, &ix, &ierr);
  if (rc == 0) {
    /* What the one-pass reader takes, jansson's strict loader takes too: no key repeated anywhere. */
    json_error_t jerr;
    json_t *tree = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    FUZZ_CHECK(tree != NULL, "the index reader took what jansson refuses: %s", jerr.text);
    json_decref(tree);
    for (size_t i = 0; i < ix.nentries; i++) {
      FUZZ_CHECK(ix.entries[i].file < ix.nfiles, "entry %zu names file %u of %zu", i, ix.entries[i].file,
                 ix.nfiles);
      if (i) FUZZ_CHECK(strcmp(ix.entries[i - 1].tensor, ix.entries[i].tensor) < 0, "weight_map not sorted");
    }
    for (size_t i = 0; i < ix.nfiles; i++) {
      const char *f = ix.files[i];
      size_t n = strlen(f);
      FUZZ_CHECK(!strchr(f, '/') && n > 12 && strcmp(f + n - 12, ".safetensors") == 0, "file '%s'", f);
      if (i) FUZZ_CHECK(strcmp(ix.files[i - 1], f) < 0, "files not sorted and distinct");
    }
  } else {
    FUZZ_CHECK(rc == SHARDD_E_FORMAT || rc == SHARDD_E_NO_MEMORY, "index rc %d: %s", rc, ierr.msg);
  }
  sd_st_index_free(&ix);
  return 0;
}
