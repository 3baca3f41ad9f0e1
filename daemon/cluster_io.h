/* The multi-node writer's own small io_uring: writes and fsyncs whose completions run callbacks on the libuv loop. */
#ifndef SD_CLUSTER_IO_H
#define SD_CLUSTER_IO_H

#include <stdint.h>
#include <uv.h>

#include "sd_error.h"

/* Kept apart from writer.c's ring on purpose: that one is being reworked for
 * direct I/O with staging buffers, while peer saves write from receive
 * buffers and shared memory in whatever pieces the network delivers. */
typedef struct sd_cring sd_cring;

/* res is 0 once every byte is written (short writes are resumed) or the
 * fsync succeeded, else -errno. The callback may queue more requests. */
typedef void (*sd_cio_cb)(void *ud, int res);

int sd_cring_init(sd_cring **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err);
/* Only once no request is pending; the ring is freed after its handles close. */
void sd_cring_close(sd_cring *r);
/* 0, or -ENOMEM (no callback then). buf must stay valid until the callback. */
int sd_cring_write(sd_cring *r, int fd, const void *buf, uint64_t len, uint64_t off, sd_cio_cb cb, void *ud);
int sd_cring_fsync(sd_cring *r, int fd, sd_cio_cb cb, void *ud);
/* Requests queued or in flight. */
unsigned sd_cring_pending(const sd_cring *r);

#endif
