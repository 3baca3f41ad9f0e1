/* The Hugging Face safetensors layout model: dtypes, tensors, shard planning, headers, index, slices. Pure, no I/O. */
#ifndef SD_FORMAT_H
#define SD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * Limits
 * ------------------------------------------------------------------------ */
#define SD_MAX_DIMS 16                       /* dimensions of one tensor */
#define SD_NAME_MAX 1024                     /* bytes in a tensor name */
#define SD_HEADER_MAX 100000000ULL           /* the format's own header limit */
#define SD_DEFAULT_MAX_SHARD_SIZE 5000000000ULL
#define SD_DEFAULT_PREFIX "model"
/* Header padding so the data section starts on a 4 KiB boundary: every
 * tensor then sits at an O_DIRECT-friendly file offset (multiple of 8 too,
 * as the format asks). */
#define SD_HEADER_ALIGN 4096
/* The placement rule (PROTOCOL.md "Placement"): a slice whose bytes lie in
 * its segment at an offset congruent to its file offset modulo
 * SD_PLACE_ALIGN is written from there with no copy (the aligned middle of
 * it, when that is at least SD_PLACE_MIN bytes). */
#define SD_PLACE_ALIGN 4096u
#define SD_PLACE_MIN (64u << 10)
/* ... and an inner-dimension piece of at least SD_PLACE_MIN bytes starts at
 * a multiple of SD_GATHER_ALIGN, so that row fragments a multiple of it
 * long can be gathered into one direct write (where the device allows). */
#define SD_GATHER_ALIGN 512u

/* ------------------------------------------------------------------------ *
 * Dtypes (whole-byte elements only; F4/F6 are refused, see docs/formats.md)
 * ------------------------------------------------------------------------ */
#define SD_DTYPE_MAP(XX)        \
  XX(BOOL, 1) XX(U8, 1) XX(I8, 1) XX(F8_E5M2, 1) XX(F8_E4M3, 1) XX(F8_E8M0, 1) \
  XX(F8_E4M3FNUZ, 1) XX(F8_E5M2FNUZ, 1) XX(I16, 2) XX(U16, 2) XX(F16, 2)       \
  XX(BF16, 2) XX(I32, 4) XX(U32, 4) XX(F32, 4) XX(C64, 8) XX(F64, 8)           \
  XX(I64, 8) XX(U64, 8)

typedef enum {
#define SD_XX_(name, size) SD_DT_##name,
  SD_DTYPE_MAP(SD_XX_)
#undef SD_XX_
  SD_DT__COUNT
} sd_dtype;

/* 0 and *out set, or SHARDD_E_INVALID_ARGUMENT (F4/F6 named as unsupported). */
int sd_dtype_parse(const char *s, sd_dtype *out, sd_error *err);
const char *sd_dtype_name(sd_dtype dt);
unsigned sd_dtype_size(sd_dtype dt); /* bytes per element == alignment */

/* ------------------------------------------------------------------------ *
 * Tensors
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *name;        /* NUL-terminated, owned by the caller */
  sd_dtype dtype;
  uint32_t ndim;           /* 0 for a scalar */
  uint64_t shape[SD_MAX_DIMS];
  int64_t index;           /* explicit state-dict position, or -1 */
  const char *prefix;      /* its own file series' prefix (an optimizer's beside a model's); NULL: the plan's */
} sd_tensor;

/* Valid UTF-8, no NUL, 1..SD_NAME_MAX bytes, not "__metadata__". */
int sd_name_check(const char *name, size_t len, sd_error *err);
/* Element count and byte size with overflow checks; errors name the tensor. */
int sd_tensor_numel(const char *name, uint32_t ndim, const uint64_t *shape, uint64_t *numel,
                    sd_error *err);
int sd_tensor_nbytes(const sd_tensor *t, uint64_t *nbytes, sd_error *err);
/* Natural order: digit runs compare as numbers, so "layers.2" < "layers.10". */
int sd_natural_cmp(const char *a, const char *b);

/* ------------------------------------------------------------------------ *
 * Shard planning, like huggingface_hub's split_state_dict_into_shards_factory.
 * Tensors of another prefix (sd_tensor.prefix) make a file series of their
 * own, split and numbered alone (optimizer-00001-of-00002.safetensors beside
 * model-00001-of-00003.safetensors), after the plan's own series and in the
 * order their first tensor is walked; one index covers every series.
 * ------------------------------------------------------------------------ */
#define SD_MAX_SERIES 16             /* file prefixes in one plan */
typedef struct {
  const char *key;
  const char *value;
} sd_kv;

typedef struct {
  uint64_t max_shard_size;  /* 0: SD_DEFAULT_MAX_SHARD_SIZE */
  const char *prefix;       /* NULL: SD_DEFAULT_PREFIX */
  const sd_kv *metadata;    /* caller's __metadata__ pairs ("format" is forced to "pt") */
  size_t nmetadata;
  int checksums;            /* room for each file's data CRC-32C (sd_checksum.h): in the index, or a single file's header */
  /* The index's total_parameters when has_total_parameters (transformers counts its parameters,
   * not the buffers it saves too; at most the tensors' elements); else those elements, counted. */
  uint64_t total_parameters;
  int has_total_parameters;
  /* The caller's names are known to differ (the daemon's name table): the walk is found by one
   * sort of positions and names together rather than a sort of names and then of positions. */
  int names_unique;
} sd_plan_opts;

typedef struct {
  uint32_t file;            /* index into sd_plan.files */
  uint64_t nbytes;
  uint64_t data_begin;      /* data_offsets[0], relative to the data section */
  uint64_t file_offset;     /* absolute offset in the file: 8 + header_len + data_begin */
} sd_plan_loc;

typedef struct {
  char *name;               /* "model-00001-of-00003.safetensors" */
  size_t ntensors;
  uint32_t *tensors;        /* input indices, in header (and data) order */
  char *header;             /* 8-byte little-endian length + padded JSON */
  uint64_t header_size;     /* bytes in header[], == 8 + JSON length */
  uint64_t data_size;
  uint64_t file_size;       /* header_size + data_size */
  uint64_t sum_at;          /* a single file with checksums: where in header[] its CRC's hex digits go (0: none) */
} sd_plan_file;

typedef struct {
  size_t ntensors;
  sd_plan_loc *loc;         /* per input tensor, same order as given */
  size_t nfiles;
  sd_plan_file *files;
  uint64_t total_size;      /* sum of tensor bytes (index "total_size") */
  uint64_t total_parameters;
  int needs_index;          /* 0 when a single file named PREFIX.safetensors */
  char *index_name;         /* "PREFIX.safetensors.index.json" */
  char *headers;            /* when set, the one block every files[i].header and loc point into */
  int checksums;            /* sd_plan_opts.checksums: the index (or the one header) holds placeholders for them */
} sd_plan;

/* Assigns each tensor a file and an offset and encodes every header.
 * Tensor names must be unique (checked). The tensors array must outlive p. */
/* A file-name prefix: non-empty, at most 200 bytes, UTF-8, no '/', no leading '.',
 * no control characters. The daemon checks it at begin with the same rule. */
int sd_prefix_check(const char *prefix, sd_error *err);

int sd_plan_build(sd_plan *p, const sd_tensor *tensors, size_t n, const sd_plan_opts *opts,
                  sd_error *err);
void sd_plan_free(sd_plan *p);

/* The index JSON (sorted keys, indent 2, trailing newline), malloc'd. With
 * p->checksums its metadata maps every file to "00000000", a placeholder
 * that sd_index_put_sums fills in once the files' CRCs are known. */
char *sd_index_encode(const sd_plan *p, const sd_tensor *tensors, size_t *len, sd_error *err);
/* Writes crcs[f] (per plan file) over the placeholders of an index that
 * sd_index_encode made from p (checksums on), in place: its length does not change. */
int sd_index_put_sums(char *json, size_t len, const sd_plan *p, const uint32_t *crcs, sd_error *err);
/* Writes crc over the placeholder of a single file's header (f->sum_at) in
 * header: f->header, or a copy of it. */
void sd_header_put_sum(const sd_plan_file *f, char *header, uint32_t crc);

/* ------------------------------------------------------------------------ *
 * Slices
 * ------------------------------------------------------------------------ */
typedef struct {
  uint64_t start[SD_MAX_DIMS];
  uint64_t count[SD_MAX_DIMS];
} sd_box;

/* The box lies within shape (overflow-safe); errors name the tensor. */
int sd_box_check(const char *name, uint32_t ndim, const uint64_t *shape, const sd_box *b,
                 sd_error *err);

/* Decides whether boxes cover shape exactly once. Identical boxes are replicas:
 * keep[i] is 1 for the first of each group and 0 for the copies. An empty box
 * (a zero count) of a non-empty tensor covers and overlaps nothing: keep[i] 0,
 * and a tensor only such boxes cover has a gap. A partial
 * overlap fails with SHARDD_E_OVERLAP naming both boxes; a hole fails with
 * SHARDD_E_GAP naming the tensor and the first uncovered element (row-major). */
int sd_coverage_check(const char *name, uint32_t ndim, const uint64_t *shape, const sd_box *boxes,
                      size_t n, uint8_t *keep, sd_error *err);

/* Calls cb for each contiguous byte run that copies the packed row-major
 * bytes of box b into a row-major tensor of shape stored at file_base:
 * dst is the file offset, src the offset within the packed slice. Adjacent
 * runs are coalesced (one run for a dim-0 split, one per row for an inner
 * split). A non-zero return from cb stops the walk and is returned. */
typedef int (*sd_run_cb)(void *ud, uint64_t dst, uint64_t src, uint64_t len);
int sd_box_runs(uint32_t ndim, const uint64_t *shape, unsigned elem_size, const sd_box *b,
                uint64_t file_base, sd_run_cb cb, void *ud);

/* ------------------------------------------------------------------------ *
 * A multi-node save's attempt on its folder (PEERS.md, "When the leader is
 * lost"): the leader's id for the attempt (16 hex digits, the "cid" of its
 * messages), set on the temporary folder before any node writes, so the
 * published folder carries it and `shardctl outcome` can tell later whether
 * that attempt was published. user.*, or trusted.* where a root daemon finds
 * user.* refused, as for the owner. No file of the checkpoint changes.
 * ------------------------------------------------------------------------ */
#define SD_ATTEMPT_XATTR "user.shardd.attempt"
#define SD_ATTEMPT_XATTR_TRUSTED "trusted.shardd.attempt"
#define SD_ATTEMPT_LEN 16
/* A node that lost the leader after its done and found the folder not yet
 * published renames it to its temporary name plus this, so the leader's
 * rename can never happen (the leader's tag stays in front: its start-up
 * clean-up removes a leftover). */
#define SD_WITHDRAWN_SUFFIX "-withdrawn"

#endif
