/* Shared fixture of the writer tests (test_publish.c, test_staging.c, test_copies.c, test_gather.c): a root in a fresh folder, a loop, a writer, publish outcomes, bytes read back. */
#ifndef SD_UNIT_FIXTURE_ROOT_H
#define SD_UNIT_FIXTURE_ROOT_H

#include <stddef.h>
#include <stdint.h>

#include "pathsafe.h"
#include "publish.h"
#include "writer.h"

/* One test's root, loop and writer (criterion runs each test in its own process). */
typedef struct {
  char base[64];            /* the fresh folder holding everything below */
  char root[256];
  char outside[256];        /* beside the root: escapes must leave it empty */
  char mnt[256];            /* a file system a test mounted there; unmounted at teardown */
  int root_fd;
  uv_loop_t loop;
  sd_writer *w;             /* made by the test or its setup; closed at teardown */
} fr_root;

extern fr_root FR;

/* mkdtemp(tmpl) as FR.base with `outside` and `root` in it, the root opened and
 * the loop initialised; no writer yet. */
void fr_setup(const char *tmpl);
/* Closes the writer and the loop (expecting nothing left open), the root,
 * unmounts FR.mnt and removes FR.base. */
void fr_teardown(void);
/* sd_writer_close callback: sets the int at ud. */
void fr_closed_cb(void *ud);
/* Makes path the root (FR.root, FR.root_fd), closing the previous one. */
void fr_open_root(const char *path);
/* A fresh file system of type fstype (mount options opts, may be NULL)
 * mounted at FR.base/fstype as FR.mnt (unmounted by fr_teardown), with the
 * root in it. Skips the test when it cannot mount (needs root). */
void fr_open_mounted_root(const char *fstype, const char *opts);
/* fr_open_mounted_root("ramfs"): a file system that refuses O_DIRECT. */
void fr_open_ramfs_root(void);

/* What a publish reported through its callbacks (ud of fr_on_released/fr_on_done). */
typedef struct {
  int done, released, released_after_done;
  int code;
  char msg[SD_ERRMSG_MAX];
  char path[1024];
  uint64_t written, total;
  uint64_t zero_copy;       /* of written: zero-copy from the sources */
  uint64_t gathered;        /* of written: gathered from several sources in one writev */
  uint64_t sealed;          /* source bytes staged from sealed spans by plain memcpy */
} fr_outcome;

void fr_on_released(sd_publish *p, void *ud);
void fr_on_done(sd_publish *p, void *ud, const sd_error *err, const char *path);
/* Runs the loop until o's publish is done; asserts on_done came exactly once. */
void fr_run_until(const fr_outcome *o);

/* xorshift64 from the seed a test file chose (fr_seed), so its data stays the same. */
void fr_seed(uint64_t seed);
uint64_t fr_rnd(void);
/* Shuffles ops (fr_rnd) so they reach the writer out of order. */
void fr_shuffle_ops(sd_write_op *ops, size_t n);

/* A whole file (malloc'd); NULL when it cannot be opened. */
uint8_t *fr_slurp(const char *path, size_t *len);
/* Expects the file at path to hold exactly the len bytes of want (name in messages). */
void fr_expect_file(const char *path, const char *name, const uint8_t *want, uint64_t len);

#endif
