/* Strict safetensors reader for single files and checkpoint folders, written apart from the writer. */
#ifndef SD_READER_H
#define SD_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "sd_error.h"
#include "sd_format.h"

/* Every problem found here is reported as SHARDD_E_FORMAT with a message that
 * starts with the file's label and names the tensor and field at fault, e.g.
 *   model-00001-of-00002.safetensors: tensor 'w': data_offsets [0,10] but F32[3] needs 12 bytes
 * A folder whose files disagree with its index (a shard-named file the index
 * does not name, a named file missing, shards without their index) gives
 * SHARDD_E_FILE_SET naming the file. Files that cannot be opened or read give
 * SHARDD_E_IO; allocation failures SHARDD_E_NO_MEMORY. Nothing is ever written. */

/* ------------------------------------------------------------------------ *
 * One .safetensors file
 * ------------------------------------------------------------------------ */
typedef struct {
  char *name;
  sd_dtype dtype;
  uint32_t ndim;
  uint64_t shape[SD_MAX_DIMS];
  uint64_t numel;
  uint64_t begin;           /* data_offsets[0], relative to the data section */
  uint64_t end;             /* data_offsets[1]; end - begin == numel * dtype size */
} sd_st_tensor;

typedef struct {
  char *key;
  char *value;
} sd_st_meta;

typedef struct {
  uint64_t header_len;      /* JSON bytes, as the 8-byte little-endian prefix says */
  uint64_t data_start;      /* 8 + header_len: file offset of data byte 0 */
  uint64_t data_size;       /* file_size - data_start, == end of the last tensor */
  uint64_t file_size;
  size_t ntensors;
  sd_st_tensor *tensors;    /* sorted by data_offsets (file order) */
  size_t nmeta;
  sd_st_meta *meta;         /* __metadata__ pairs, in file order */
  uint64_t total_parameters;
} sd_st_header;

/* Pure: checks and parses a file's leading bytes. buf holds the 8-byte length
 * prefix followed by at least header_len bytes of JSON (it may be the whole
 * file); file_size is the file's full length. label names the file in
 * messages. On success *h is filled and must be released with
 * sd_st_header_free; on failure *h is left empty (safe to free). */
int sd_st_parse(const char *label, const void *buf, size_t len, uint64_t file_size,
                sd_st_header *h, sd_error *err);
void sd_st_header_free(sd_st_header *h);

/* Every reader opens its files through this: dirfd/path (AT_FDCWD for a
 * plain path; symlinks followed), O_NONBLOCK so that a FIFO, a socket or a
 * device never holds the open, then fstat before any read: anything but a
 * regular file is SHARDD_E_FORMAT "LABEL: not a regular file (a fifo)".
 * *st gets the fstat; returns the descriptor (>= 0) or -1 with err set. */
int sd_open_regular(int dirfd, const char *path, const char *label, struct stat *st, sd_error *err);

/* Opens dirfd/path (AT_FDCWD for a plain path; symlinks are followed, as in
 * the Hugging Face cache), requires a regular file, reads the header and
 * parses it. label defaults to path when NULL. */
int sd_st_read_fileat(int dirfd, const char *path, const char *label, sd_st_header *h,
                      sd_error *err);
int sd_st_read_file(const char *path, sd_st_header *h, sd_error *err);

/* The data CRC-32C a single-file checkpoint records in its __metadata__
 * (SD_CHECKSUM_KEY, sd_checksum.h): *has 0 when the key is absent (written
 * by another tool, or with checksums = off); a value that is not exactly 8
 * hex digits is SHARDD_E_FORMAT naming the file and the key. */
int sd_st_meta_crc(const char *label, const sd_st_header *h, int *has, uint32_t *crc,
                   sd_error *err);

/* Linear search; NULL when absent. */
const sd_st_tensor *sd_st_find(const sd_st_header *h, const char *name);

/* ------------------------------------------------------------------------ *
 * A checkpoint folder: PREFIX.safetensors.index.json plus the shards it
 * names, or a single *.safetensors file and no index.
 * ------------------------------------------------------------------------ */
typedef struct {
  char *name;               /* plain file name inside the folder */
  sd_st_header h;
  int has_crc;              /* the checkpoint records this file's data CRC-32C: */
  uint32_t crc;             /* from the index's metadata, or a single file's __metadata__ */
} sd_ckpt_file;

typedef struct {
  char *index_name;         /* NULL when the folder has no index */
  char *prefix;             /* from the index name, or the single file's stem */
  size_t nfiles;
  sd_ckpt_file *files;      /* sorted by name */
  uint64_t ntensors;
  uint64_t total_size;      /* sum of tensor bytes */
  uint64_t total_parameters;
} sd_ckpt;

/* Checks the whole folder. Messages name the file inside the folder (not the
 * folder itself). Shard-named files are PREFIX.safetensors and
 * PREFIX-NNNNN-of-NNNNN.safetensors (five digits or more); every other file
 * (config.json, another prefix's .safetensors) is left alone. On failure *c is
 * left empty (safe to free). */
int sd_ckpt_read(const char *dir, sd_ckpt *c, sd_error *err);
/* A single .safetensors file at path (AT_FDCWD-relative), as a one-file
 * checkpoint without index: files[0].name is the path's last component. */
int sd_ckpt_read_single(const char *path, sd_ckpt *c, sd_error *err);
void sd_ckpt_free(sd_ckpt *c);

/* ------------------------------------------------------------------------ *
 * The deep check (proto/verify.c): every byte of each file's data section
 * read in order and its CRC-32C compared with the recorded one. The strict
 * checks above read only headers; this reads the whole checkpoint once.
 * ------------------------------------------------------------------------ */
/* Reads file i's data section through fd (opened on c->files[i], e.g. when
 * it was checked) and sets *got to its CRC-32C. A file whose size is no
 * longer the one its header was checked against is SHARDD_E_FORMAT naming
 * it as truncated (or grown); a recorded CRC that differs is
 * SHARDD_E_CHECKSUM naming the file and both values. Without a recorded
 * CRC (has_crc 0) it only computes *got. */
int sd_ckpt_file_verify(const sd_ckpt *c, size_t i, int fd, uint32_t *got, sd_error *err);
/* Every file through fds[i]; the first failure is returned. A checkpoint
 * that records no checksum at all is SHARDD_E_CHECKSUM without reading a
 * byte: nothing could be compared. One that records some files' but not
 * others' cannot be parsed (the index records every file or none). */
int sd_ckpt_verify(const sd_ckpt *c, const int *fds, sd_error *err);
/* The same check, for a reader that keeps no file open between reads: open(ud, i, err) gives file
 * i's descriptor (or -1 with err set), and close(ud, i, fd) is called once that file is checked. */
typedef struct {
  int (*open)(void *ud, size_t i, sd_error *err);
  void (*close)(void *ud, size_t i, int fd);
  void *ud;
} sd_ckpt_fds;
int sd_ckpt_verify_each(const sd_ckpt *c, const sd_ckpt_fds *fds, sd_error *err);

/* ------------------------------------------------------------------------ *
 * The index, parsed and cross-checked purely (sd_ckpt_read uses these).
 * ------------------------------------------------------------------------ */
typedef struct {
  char *tensor;
  uint32_t file;            /* index into sd_st_index.files */
} sd_st_index_entry;

typedef struct {
  uint64_t total_size;
  int has_total_parameters;
  uint64_t total_parameters;
  size_t nentries;
  sd_st_index_entry *entries; /* weight_map, sorted by tensor name (strcmp) */
  size_t nfiles;
  char **files;             /* distinct plain file names, sorted (strcmp) */
  uint32_t *crcs;           /* files[i]'s data CRC-32C; NULL when the index records none */
} sd_st_index;

/* {"metadata": {"total_size": N, ...}, "weight_map": {tensor: file}}; no
 * duplicate keys, no other top-level keys, file names plain (no '/'), ending
 * in ".safetensors". metadata's SD_CHECKSUM_KEY, when present, maps every
 * file the weight_map names (and no other) to 8 hex digits. */
int sd_st_index_parse(const char *label, const char *json, size_t len, sd_st_index *ix,
                      sd_error *err);
void sd_st_index_free(sd_st_index *ix);
/* files[i] must be the shard named ix->files[i], already read. Every header
 * tensor is in the map pointing at its own file, every map entry is found in
 * its file, total_size matches, and total_parameters (when present) is no more than
 * the tensors hold: transformers counts parameters only, not buffers. */
int sd_st_index_check(const char *label, const sd_st_index *ix, const sd_ckpt_file *files,
                      sd_error *err);

#endif
