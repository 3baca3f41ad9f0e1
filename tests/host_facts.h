/* Facts of the test machine that every suite asks alike: a folder's direct-I/O alignment, root, and ids that exist nowhere. */
#ifndef SHARDD_TESTS_HOST_FACTS_H
#define SHARDD_TESTS_HOST_FACTS_H

/* Users and groups that exist nowhere: numbers are all the kernel needs. */
#define TH_G_TRUST 4242
#define TH_U_OTHER 4243
#define TH_G_OTHER 4244
#define TH_U_THIRD 4245

/* The direct-I/O alignment (statx STATX_DIOALIGN) of files made in dir, 0 when the device tells none. */
unsigned th_dio_align(const char *dir);

/* Skips the running criterion test unless it runs as root; `why` completes "needs root to ...". */
#define TH_NEED_ROOT(why)                                          \
  do {                                                             \
    if (geteuid() != 0) cr_skip_test("needs root to %s", (why));   \
  } while (0)

#endif
