/* systemd integration for the daemon: readiness/status/watchdog notifications and socket activation. */
#ifndef SD_SDNOTIFY_H
#define SD_SDNOTIFY_H

#include <stdarg.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * How the daemon is meant to use this (all calls are no-ops outside systemd)
 *
 *   At start-up, before any thread exists and before the socket is bound:
 *
 *     int fds[8];
 *     sd_error err;
 *     int n = sd_sys_listen_fds(fds, 8, &err);
 *     if (n < 0)  -> log err.msg, exit non-zero
 *     if (n == 0) -> not socket-activated: bind --socket yourself as usual
 *     if (n >= 1) -> fds[0] is the listening Unix socket from shardd.socket
 *                    (uv_pipe_open() it; check sd_sys_is_unix_stream_listener()
 *                    first); do NOT unlink that path on shutdown, systemd owns it
 *
 *     uint64_t wd = sd_sys_watchdog_usec();   // 0: no watchdog configured
 *     if (wd) -> start a uv timer firing every wd/2 microseconds (as ms:
 *                wd / 2000) that calls sd_sys_notify_watchdog(). Fire it from
 *                the loop thread so a stuck loop stops the pings: that is
 *                the whole point of the watchdog.
 *
 *   Once the socket accepts connections and the root is open:
 *     sd_sys_notify_ready("serving /var/lib/shardd/checkpoints");
 *
 *   Whenever the set of saves in flight changes (or on the watchdog tick):
 *     sd_sys_notify_status("%d saves in flight, %d clients", nsaves, nclients);
 *
 *   On SIGHUP:  sd_sys_notify_reloading(); ...reload...; sd_sys_notify_ready(NULL);
 *   On SIGTERM: sd_sys_notify_stopping(); then finish or fail in-flight saves.
 *     A drain longer than TimeoutStopSec= can ask for more time with
 *     sd_sys_notify("EXTEND_TIMEOUT_USEC=%llu", usec).
 *
 * Return convention of every notify call: 1 when the datagram was sent, 0 when
 * NOTIFY_SOCKET is unset (not run by systemd; nothing to do), or a negative
 * SHARDD_E_* code. A failed notification is worth a log line, never an exit.
 *
 * Thread-safety: the notify calls keep no state and may be called from any
 * thread, as long as no thread is changing the environment at the same time.
 * sd_sys_listen_fds() edits the environment: call it once, early, single-threaded.
 * ------------------------------------------------------------------------ */

/* Socket activation passes its descriptors from this number upwards. */
#define SD_SYS_LISTEN_FDS_START 3

/* ---- Socket activation (LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES) ---- */

/* Collects the listening sockets systemd passed to this process. Returns their
 * number (0 when not socket-activated or when the variables were meant for
 * another process, i.e. LISTEN_PID is not getpid()), with fds[0..n-1] set to
 * 3, 4, ... and marked close-on-exec. More than max sockets, a malformed
 * variable or a descriptor that is not open is an error (SHARDD_E_LIMIT,
 * SHARDD_E_INVALID_ARGUMENT). In every case LISTEN_PID, LISTEN_FDS and
 * LISTEN_FDNAMES are removed from the environment so no child inherits them. */
int sd_sys_listen_fds(int *fds, int max, sd_error *err);

/* 1 if fd is a listening AF_UNIX SOCK_STREAM socket, 0 otherwise. */
int sd_sys_is_unix_stream_listener(int fd);

/* ---- Notifications over NOTIFY_SOCKET (sd_notify protocol) ---- */

/* Sends msg as one datagram ("READY=1\nSTATUS=..."), as is. */
int sd_sys_notify_send(const char *msg, sd_error *err);

/* printf-style sd_sys_notify_send, for any assignment systemd understands. */
int sd_sys_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int sd_sys_vnotify(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* "READY=1", plus "STATUS=<status>" when status is not NULL. */
int sd_sys_notify_ready(const char *status);
/* "STATUS=<formatted>"; newlines in the text become spaces, since a newline
 * would end the assignment early. */
int sd_sys_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int sd_sys_notify_watchdog(void);   /* "WATCHDOG=1" */
int sd_sys_notify_reloading(void);  /* "RELOADING=1": follow with sd_sys_notify_ready() */
int sd_sys_notify_stopping(void);   /* "STOPPING=1" */

/* The watchdog interval systemd expects pings within (WatchdogSec=), in
 * microseconds; 0 when there is none, when WATCHDOG_PID names another
 * process, or when WATCHDOG_USEC is malformed. Ping at half this interval. */
uint64_t sd_sys_watchdog_usec(void);

/* ---- Pure helpers (no I/O), exposed for the unit tests ---- */

/* Strict unsigned decimal: digits only, no sign, no blanks, no overflow. 0 or -1. */
int sd_sys_parse_u64(const char *s, uint64_t *out);

/* Turns a NOTIFY_SOCKET value into an address: "/abs/path" is a filesystem
 * socket, "@name" an abstract one (leading NUL). Anything else, or a name too
 * long for sun_path, is SHARDD_E_INVALID_ARGUMENT. */
int sd_sys_notify_address(const char *spec, struct sockaddr_un *sa, socklen_t *len,
                          sd_error *err);

#endif
