/* CRC-32C of a shard file's data section, computed from pieces in any order, on any thread or node (proto/checksum.c). */
#ifndef SD_CHECKSUM_H
#define SD_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* Where a checkpoint records it, in a form transformers and safetensors
 * ignore: the index's "metadata" maps each shard file to the CRC-32C of its
 * data section (every byte after the header) as 8 lowercase hex digits; a
 * single-file checkpoint carries the same string in its __metadata__. Any
 * crc32c tool checks it: the data section is bytes [8 + header length, end). */
#define SD_CHECKSUM_KEY "shardd_data_crc32c"
#define SD_CHECKSUM_HEX 8

/* The standard CRC-32C (Castagnoli, as iSCSI and ext4 use it) of n bytes,
 * extending crc (0 for a fresh message): sd_crc32c(sd_crc32c(0, a), b) is
 * the CRC of a followed by b. Computed by ISA-L. */
uint32_t sd_crc32c(uint32_t crc, const void *p, size_t n);

/* ------------------------------------------------------------------------ *
 * A message assembled from pieces. The CRC is linear in the message, so a
 * piece's share of it depends only on its bytes and on how many bytes
 * follow it to the end of the message; shares of different pieces are
 * XORed together in any order, and bytes no piece covers count as zeros.
 * ------------------------------------------------------------------------ */
/* The share of n bytes at p followed by `after` more bytes of the message. */
uint32_t sd_crc32c_piece(const void *p, size_t n, uint64_t after);
/* A piece read in parts: run the register over each part in order from 0
 * (sd_crc32c_run(sd_crc32c_run(0, a), b) is a followed by b), then
 * sd_crc32c_shift it by the bytes after the piece. */
uint32_t sd_crc32c_run(uint32_t reg, const void *p, size_t n);
/* A share computed against the end of a part of the message, moved to a
 * message that goes on n more bytes past that part (a region's share to the
 * whole file's). */
uint32_t sd_crc32c_shift(uint32_t share, uint64_t n);
/* The CRC-32C of the whole len-byte message, from the XOR of every piece's share. */
uint32_t sd_crc32c_final(uint32_t shares, uint64_t len);

/* 8 lowercase hex digits and a NUL. */
void sd_crc32c_hex(uint32_t crc, char out[SD_CHECKSUM_HEX + 1]);
/* Exactly 8 hex digits (either case): 0 and *out set; -1 otherwise. */
int sd_crc32c_parse(const char *s, uint32_t *out);

#endif
