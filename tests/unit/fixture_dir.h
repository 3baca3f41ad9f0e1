/* A fresh folder per test for the reader tests (test_checkpoint.c, test_ckpt_checksum.c, test_load.c): files put in it by hand, removed afterwards. */
#ifndef SD_UNIT_FIXTURE_DIR_H
#define SD_UNIT_FIXTURE_DIR_H

#include <stddef.h>

extern char tmpdir[64]; /* the fresh folder */
extern char ckdir[128]; /* tmpdir/ck: where a test's checkpoint goes */

/* mkdtemp /tmp/shardd-test-TAG-XXXXXX as tmpdir; make_ck: ckdir is made too
 * (else left for the writer under test to make). */
void dir_setup(const char *tag, int make_ck);
/* Removes tmpdir and everything in it. */
void dir_teardown(void);
/* ckdir/name into buf. */
void path_of(char *buf, size_t n, const char *name);
/* ckdir/name holding exactly len bytes of b. */
void put(const char *name, const void *b, size_t len);
void put_str(const char *name, const char *s);

#endif
