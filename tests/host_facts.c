/* The direct-I/O probe every suite runs the same way: make a file with O_DIRECT in the folder and ask statx. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_facts.h"

unsigned th_dio_align(const char *dir) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/.dio-probe", dir);
  int fd = open(p, O_CREAT | O_WRONLY | O_DIRECT, 0600);
  unsigned a = 0;
  struct statx sx;
  if (fd >= 0 && statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN))
    a = sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
  if (fd >= 0) close(fd);
  unlink(p);
  return a;
}
