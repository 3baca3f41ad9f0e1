/* The deep check of a checkpoint: each file's data section read once, in order, and its CRC-32C compared with the recorded one. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sd_checksum.h"
#include "sd_layout.h"
#include "sd_reader.h"

#define SHOW(buf, s) sd_msgstr(buf, sizeof buf, s, strlen(s))

/* Large enough that the CRC (tens of GB/s) waits on the disk, not on calls;
 * small enough to sit in the last-level cache's neighbourhood. */
#define CHUNK (8u << 20)

/* Where the recorded value came from, as messages say it. */
static const char *recorder(const sd_ckpt *c) { return c->index_name ? "the index records" : "its __metadata__ records"; }

static int size_changed(const char *name, uint64_t now, uint64_t want, sd_error *err) {
  return sd_fail(err, SHARDD_E_FORMAT,
                 "%s: %s: %" PRIu64 " bytes, but its header was checked against %" PRIu64
                 " (it changed after it was opened)",
                 name, now < want ? "truncated" : "grown", now, want);
}

int sd_ckpt_file_verify(const sd_ckpt *c, size_t i, int fd, uint32_t *got, sd_error *err) {
  const sd_ckpt_file *f = &c->files[i];
  char nb[SD_MSGNAME_MAX];
  SHOW(nb, f->name);
  struct stat st;
  if (fstat(fd, &st) != 0) return sd_fail(err, SHARDD_E_IO, "%s: cannot stat: %s", nb, strerror(errno));
  if ((uint64_t)st.st_size != f->h.file_size) return size_changed(nb, (uint64_t)st.st_size, f->h.file_size, err);
  size_t cap = f->h.data_size < CHUNK ? (size_t)f->h.data_size : CHUNK;
  unsigned char *buf = malloc(cap ? cap : 1);
  if (!buf) return sd_fail(err, SHARDD_E_NO_MEMORY, "%s: out of memory for the read buffer", nb);
  (void)posix_fadvise(fd, (off_t)f->h.data_start, (off_t)f->h.data_size, POSIX_FADV_SEQUENTIAL);
  uint32_t crc = 0;
  uint64_t off = 0;
  int rc = 0;
  while (off < f->h.data_size) {
    uint64_t left = f->h.data_size - off;
    size_t want = left < cap ? (size_t)left : cap;
    ssize_t r = pread(fd, buf, want, (off_t)(f->h.data_start + off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = sd_fail(err, SHARDD_E_IO, "%s: cannot read %zu bytes at %" PRIu64 ": %s", nb, want,
                   f->h.data_start + off, strerror(errno));
      break;
    }
    if (r == 0) { /* cut while we read it */
      rc = size_changed(nb, f->h.data_start + off, f->h.file_size, err);
      break;
    }
    crc = sd_crc32c(crc, buf, (size_t)r);
    off += (uint64_t)r;
  }
  free(buf);
  if (rc) return rc;
  /* Grown (or cut and grown back) while it was read: its bytes are not the ones that were checked. */
  if (fstat(fd, &st) != 0) return sd_fail(err, SHARDD_E_IO, "%s: cannot stat: %s", nb, strerror(errno));
  if ((uint64_t)st.st_size != f->h.file_size) return size_changed(nb, (uint64_t)st.st_size, f->h.file_size, err);
  *got = crc;
  if (f->has_crc && crc != f->crc) {
    char g[SD_CHECKSUM_HEX + 1], w[SD_CHECKSUM_HEX + 1];
    sd_crc32c_hex(crc, g);
    sd_crc32c_hex(f->crc, w);
    return sd_fail(err, SHARDD_E_CHECKSUM,
                   "%s: data CRC-32C is %s but %s %s (the file changed after it was saved: damaged, "
                   "or swapped in from another checkpoint)",
                   nb, g, recorder(c), w);
  }
  return 0;
}

static int fd_of_array(void *ud, size_t i, sd_error *err) {
  (void)err;
  return ((const int *)ud)[i];
}

static void keep_open(void *ud, size_t i, int fd) { (void)ud, (void)i, (void)fd; }

int sd_ckpt_verify(const sd_ckpt *c, const int *fds, sd_error *err) {
  sd_ckpt_fds each = {.open = fd_of_array, .close = keep_open, .ud = (void *)fds};
  return sd_ckpt_verify_each(c, &each, err);
}

int sd_ckpt_verify_each(const sd_ckpt *c, const sd_ckpt_fds *fds, sd_error *err) {
  size_t with = 0;
  for (size_t i = 0; i < c->nfiles; i++) with += c->files[i].has_crc != 0;
  if (with == 0) {
    char nb[SD_MSGNAME_MAX];
    const char *what = c->index_name ? c->index_name : c->nfiles ? c->files[0].name : "the checkpoint";
    return sd_fail(err, SHARDD_E_CHECKSUM,
                   "%s records no checksums (written without them, or not by shardd): nothing to verify against",
                   SHOW(nb, what));
  }
  for (size_t i = 0; i < c->nfiles; i++) {
    uint32_t got;
    int fd = fds->open(fds->ud, i, err);
    if (fd < 0) return err->code;
    int rc = sd_ckpt_file_verify(c, i, fd, &got, err);
    fds->close(fds->ud, i, fd);
    if (rc) return rc;
  }
  return 0;
}
