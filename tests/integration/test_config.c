/* The config file through a real daemon: --check-config, flags over the file, SIGHUP reload, documented keys. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops_util.h"

TestSuite(config, .init = o_scratch, .fini = h_teardown, .timeout = 100);

static const char *shardd_bin(void) {
  const char *b = getenv("SHARDD");
  cr_assert(b && *b, "SHARDD is not set");
  return b;
}

static char out[1 << 16];

/* ------------------------------------------------------------------------ *
 * --check-config
 * ------------------------------------------------------------------------ */
Test(config, check_config_prints_every_effective_setting) {
  char conf[PATH_MAX], text[4 * PATH_MAX];
  o_path(conf, sizeof conf, "shardd.conf");
  snprintf(text, sizeof text,
           "# a comment line\n"
           "\n"
           "root = %s\n"
           "   queue_depth = 12   # a trailing comment\n"
           "log_level=debug\n"
           "max_line = 1M\n"
           "socket_mode = 0600\r\n",
           H.root);
  o_write(conf, text);
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 0), "--check-config refused a valid file (0x%x):\n%s", st, out);
  char want[2 * PATH_MAX];
  snprintf(want, sizeof want, "\nroot = %s\n", H.root);
  cr_assert(strstr(out, want), "root not printed as set:\n%s", out);
  cr_assert(strstr(out, "\nqueue_depth = 12\n"), "%s", out);
  cr_assert(strstr(out, "\nlog_level = debug\n"), "%s", out);
  cr_assert(strstr(out, "\nmax_line = 1048576\n"), "a size suffix is not applied:\n%s", out);
  cr_assert(strstr(out, "\nsocket_mode = 0600\n"), "%s", out);
  cr_assert(strstr(out, "\nkeep_results = 64\n"), "an unset key does not show its default:\n%s", out);
  /* The root is only checked, never created, by --check-config. */
  cr_assert(!h_exists(H.root), "--check-config created the root");
}

Test(config, check_config_names_file_line_and_key) {
  char conf[PATH_MAX];
  o_path(conf, sizeof conf, "bad.conf");
  o_write(conf, "root = /tmp/x\n# fine so far\nbogus_key = 1\n");
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1), "an unknown key is accepted (0x%x):\n%s", st, out);
  char want[2 * PATH_MAX];
  snprintf(want, sizeof want, "%s:3: unknown key 'bogus_key'", conf);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);

  o_write(conf, "queue_depth = 8\nmax_line = lots\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1), "a bad value is accepted:\n%s", out);
  snprintf(want, sizeof want, "%s:2: key 'max_line': must be a byte count", conf);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);
  cr_assert(strstr(out, "got 'lots'"), "%s", out);

  o_write(conf, "log_level = info\nlog_level = debug\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1), "a repeated key is accepted:\n%s", out);
  snprintf(want, sizeof want, "%s:2: key 'log_level' is already set on line 1", conf);
  cr_assert(strstr(out, want), "%s", out);

  o_write(conf, "just words\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, ":1: expected 'key = value'"), "%s", out);

  o_write(conf, "socket_group = no-such-group-hopefully\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, ":1: key 'socket_group': no group named 'no-such-group-hopefully'"),
            "%s", out);

  /* The daemon itself refuses to start on the same errors. */
  o_write(conf, "root = /tmp/x\nbogus_key = 1\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--config", conf, "--socket", H.sock, (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, ":2: unknown key 'bogus_key'"), "%s", out);
  cr_assert(!h_exists(H.sock), "a daemon with a bad config still bound its socket");
}

/* shardd.conf(5): a value in quotes is the text inside them, or the file is refused; never kept with its quotes. */
Test(config, quoted_values_are_unquoted_or_refused) {
  char conf[PATH_MAX], text[4 * PATH_MAX], want[2 * PATH_MAX];
  o_path(conf, sizeof conf, "quoted.conf");
  snprintf(text, sizeof text, "root = \"%s\"  # quoted\nnode_name = 'n #1'\n", H.root);
  o_write(conf, text);
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 0), "a quoted root is refused (0x%x):\n%s", st, out);
  snprintf(want, sizeof want, "\nroot = %s\n", H.root);
  cr_assert(strstr(out, want), "the root kept its quotes:\n%s", out);
  /* Printed quoted where the plain reading would cut it: the output is a valid file too. */
  cr_assert(strstr(out, "\nnode_name = \"n #1\"\n"), "%s", out);

  o_write(conf, "queue_depth = 8\nroot = \"/data/ckpt\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1), "an unclosed quote is accepted:\n%s", out);
  snprintf(want, sizeof want, "%s:2: key 'root': the value opens a double quote that is not closed", conf);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);

  o_write(conf, "root = \"/data\"/ckpt\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--config", conf, "--socket", H.sock, (char *)NULL);
  cr_assert(o_exited(st, 1), "text after a closing quote is accepted:\n%s", out);
  snprintf(want, sizeof want, "%s:1: key 'root': text after the closing quote: '/ckpt'", conf);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);
  cr_assert(!h_exists(H.sock), "a daemon with a bad config still bound its socket");
}

/* Listen addresses are bound only at start, so --check-config reads their shape, naming the line or the flag. */
Test(config, check_config_checks_listen_addresses) {
  char conf[PATH_MAX], want[2 * PATH_MAX];
  o_path(conf, sizeof conf, "listen.conf");
  o_write(conf, "queue_depth = 8\npeer_listen = 127.0.0.1\n");
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1), "a peer_listen without a port is accepted (0x%x):\n%s", st, out);
  snprintf(want, sizeof want, "%s:2: key 'peer_listen': must be HOST:PORT or [IPV6]:PORT", conf);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);
  cr_assert(strstr(out, "got '127.0.0.1'"), "%s", out);

  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--peer-listen", "node:70000", (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "option --peer-listen: must be HOST:PORT"), "a port past 65535: %s", out);

  o_write(conf, "peer_listen = [::1]:7077\nmetrics_listen = 127.0.0.1:0\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 0), "valid listen addresses are refused (0x%x):\n%s", st, out);
  cr_assert(strstr(out, "\npeer_listen = [::1]:7077\n"), "%s", out);

  o_write(conf, "metrics_listen = nowhere\n");
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, ":1: key 'metrics_listen': must be HOST:PORT"), "%s", out);
}

Test(config, missing_file_bad_flag_and_unknown_option) {
  char conf[PATH_MAX];
  o_path(conf, sizeof conf, "absent.conf");
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "cannot open config file") && strstr(out, "absent.conf"), "%s", out);
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--queue-depth", "0", (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "option --queue-depth: must be an integer in [1, 4096], got '0'"), "%s",
            out);
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--log-level", "loud", (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "must be one of error, warn, info, debug, got 'loud'"), "%s", out);
  st = o_run(out, sizeof out, NULL, shardd_bin(), "--frobnicate", (char *)NULL);
  cr_assert(o_exited(st, 2) && strstr(out, "Try 'shardd --help'"), "%s", out);
}

/* A root the daemon's user cannot write in is refused at start and by --check-config, naming the
 * root, the user and the errno, before any rank could copy a byte for a save that cannot publish.
 * As root the daemon runs as nobody (setpriv), since root itself may write anywhere. */
Test(config, unwritable_root_is_refused_naming_root_user_and_errno) {
  char root[PATH_MAX], sock[PATH_MAX];
  o_path(root, sizeof root, "ro-root");
  o_path(sock, sizeof sock, "ro.sock");
  cr_assert_eq(mkdir(root, 0555), 0);
  cr_assert_eq(chmod(H.base, 0755), 0); /* nobody must reach the root to be refused in it */
  int as_root = geteuid() == 0;
  const char *user = as_root ? "'nobody' (uid 65534)" : "uid";
  for (int check = 0; check < 2; check++) {
    const char *mode = check ? "--check-config" : "--log-level=info"; /* a check, or a start */
    int st = as_root ? o_run(out, sizeof out, NULL, "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             shardd_bin(), "--root", root, "--socket", sock, mode, (char *)NULL)
                     : o_run(out, sizeof out, NULL, shardd_bin(), "--root", root, "--socket", sock, mode, (char *)NULL);
    cr_assert(o_exited(st, 1), "%s: a root nobody may write was accepted (0x%x):\n%s", mode, st, out);
    cr_assert(strstr(out, root) && strstr(out, user) && strstr(out, "cannot create a folder there") &&
                  strstr(out, "(EACCES)"),
              "%s: the refusal names the root, the user and the errno:\n%s", mode, out);
  }
  cr_assert(!h_exists(sock), "a refused daemon left its socket");
  cr_assert_eq(chmod(root, 0755), 0);
}

/* ------------------------------------------------------------------------ *
 * Flags override the file
 * ------------------------------------------------------------------------ */
Test(config, flags_override_the_file) {
  char conf[PATH_MAX], text[4 * PATH_MAX], file_root[PATH_MAX], flag_root[PATH_MAX];
  o_path(conf, sizeof conf, "shardd.conf");
  o_path(file_root, sizeof file_root, "file-root");
  o_path(flag_root, sizeof flag_root, "flag-root");
  snprintf(text, sizeof text, "root = %s\nqueue_depth = 12\nlog_level = debug\nsocket_mode = 0600\nkeep_results = 9\n",
           file_root);
  o_write(conf, text);
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", conf, "--queue-depth", "7",
                 "--log-level", "warn", "--root", flag_root, (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  char want[2 * PATH_MAX];
  snprintf(want, sizeof want, "\nroot = %s\n", flag_root);
  cr_assert(strstr(out, want), "--root does not override the file:\n%s", out);
  cr_assert(strstr(out, "\nqueue_depth = 7\n"), "--queue-depth does not override the file:\n%s", out);
  cr_assert(strstr(out, "\nlog_level = warn\n"), "--log-level does not override the file:\n%s", out);
  cr_assert(strstr(out, "\nsocket_mode = 0600\n"), "a key not given as a flag lost the file's value:\n%s", out);
  cr_assert(strstr(out, "\nkeep_results = 9\n"), "%s", out);

  /* A real daemon: the socket gets the flag's mode over the file's, and a
   * save lands under the flag's root. */
  snprintf(H.root, sizeof H.root, "%s", flag_root);
  const char *extra[] = {"--config", conf, "--socket-mode", "0640", NULL};
  o_start(extra, NULL);
  struct stat sb;
  cr_assert_eq(stat(H.sock, &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0640, "socket mode is %o, the flag said 0640", sb.st_mode & 0777);
  h_expect_serving();
  cr_assert(!h_exists(file_root), "the file's root was used although --root overrides it");
  o_stop();

  /* Without the flag the file's mode applies. */
  const char *extra2[] = {"--config", conf, NULL};
  o_start(extra2, NULL);
  cr_assert_eq(stat(H.sock, &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0600, "socket mode is %o, the file said 0600", sb.st_mode & 0777);
  o_stop();
}

/* ------------------------------------------------------------------------ *
 * The default socket: daemon and client library follow one rule
 * ------------------------------------------------------------------------ */
Test(config, unprivileged_default_socket_agrees_with_the_client) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0)
    cr_skip_test("needs root and setpriv(1) to run the daemon and client as another user");
  char run[PATH_MAX], root[PATH_MAX], sock[PATH_MAX + 16], env_xdg[PATH_MAX + 32];
  cr_assert_eq(chmod(H.base, 0711), 0);
  o_path(run, sizeof run, "xdg");
  o_path(root, sizeof root, "nobody-root");
  cr_assert_eq(mkdir(run, 0700), 0);
  cr_assert_eq(chown(run, 65534, 65534), 0);
  cr_assert_eq(mkdir(root, 0700), 0);
  cr_assert_eq(chown(root, 65534, 65534), 0);
  snprintf(sock, sizeof sock, "%s/shardd.sock", run);
  snprintf(env_xdg, sizeof env_xdg, "XDG_RUNTIME_DIR=%s", run);
  /* An empty SHARDD_SOCKET counts as unset for both. */
  const char *env[] = {env_xdg, "SHARDD_SOCKET=", NULL};
  const char *argv[] = {"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        getenv("SHARDD"), "--root", root, NULL};
  o_spawn(argv, env, -1);
  o_wait_accepts(sock); /* the daemon chose $XDG_RUNTIME_DIR/shardd.sock */
  int st = o_run(out, sizeof out, env, "/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534",
                 "--clear-groups", getenv("SHARDCTL"), "status", (char *)NULL);
  cr_assert(o_exited(st, 0), "shardctl without --socket did not find the daemon (0x%x):\n%s", st, out);
  cr_assert(strstr(out, "no saves in flight"), "%s", out);
  o_stop();
  cr_assert(!h_exists(sock), "the daemon left %s behind", sock);
}

/* ------------------------------------------------------------------------ *
 * SIGHUP
 * ------------------------------------------------------------------------ */
Test(config, sighup_applies_log_level_and_reports_root_unchangeable) {
  char conf[PATH_MAX], text[4 * PATH_MAX], other[PATH_MAX];
  o_path(conf, sizeof conf, "shardd.conf");
  o_path(other, sizeof other, "other-root");
  snprintf(text, sizeof text, "root = %s\nlog_level = info\nmax_saves = 64\n", H.root);
  o_write(conf, text);
  /* Root and socket come from the file here, not from flags. */
  const char *argv[] = {getenv("SHARDD"), "--config", conf, "--socket", H.sock, NULL};
  o_spawn(argv, NULL, -1);
  o_wait_accepts(H.sock);
  h_expect_serving();
  cr_assert(!o_log_has(" debug: "), "debug lines logged at level info");

  snprintf(text, sizeof text, "root = %s\nlog_level = debug\nmax_saves = 5\n", other);
  o_write(conf, text);
  cr_assert_eq(kill(H.pid, SIGHUP), 0);
  char *log = o_log_wait("reload done");
  cr_assert(strstr(log, "reload: applied log_level = debug (was info)"), "log level not applied:\n%s", log);
  cr_assert(strstr(log, "reload: applied max_saves = 5 (was 64)"), "a limit was not applied:\n%s", log);
  char want[4 * PATH_MAX];
  snprintf(want, sizeof want, "reload: cannot change root while shardd runs: keeping %s, %s:1: key 'root' says %s",
           H.root, conf, other);
  cr_assert(strstr(log, want), "the root change is not reported as impossible (want '%s'):\n%s", want, log);
  cr_assert(strstr(log, "reload done: 2 settings applied"), "%s", log);
  free(log);

  /* Debug lines now appear: a new connection is logged at debug level. */
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  free(o_log_wait(" debug: client "));
  shardd_close(c);
  /* Saves still go to the old root. */
  h_expect_serving();
  cr_assert(!h_exists(other), "the root moved on SIGHUP");

  /* An invalid file changes nothing, and says so. */
  o_write(conf, "log_level = info\nnot a setting\n");
  cr_assert_eq(kill(H.pid, SIGHUP), 0);
  log = o_log_wait("reload failed, nothing changed");
  cr_assert(strstr(log, ":2: expected 'key = value'"), "%s", log);
  free(log);
  int st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "\nshardd_config_reloads_total 2\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_config_reload_failures_total 1\n"), "%s", out);
  h_expect_serving();
  o_stop();
}

/* ------------------------------------------------------------------------ *
 * Every key is documented, with its default
 * ------------------------------------------------------------------------ */
Test(config, every_key_documented_in_shipped_file_and_man_page) {
  const char *src = getenv("SHARDD_SOURCE_ROOT");
  cr_assert(src && *src, "SHARDD_SOURCE_ROOT is not set (meson test sets it)");
  char path[1024];
  snprintf(path, sizeof path, "%s/etc/shardd.conf.in", src);
  char *conf = h_slurp(path, NULL);
  cr_assert_not_null(conf, "cannot read %s", path);
  snprintf(path, sizeof path, "%s/doc/man/shardd.conf.5", src);
  char *man = h_slurp(path, NULL);
  cr_assert_not_null(man, "cannot read %s", path);
  snprintf(path, sizeof path, "%s/doc/man/shardd.8", src);
  char *man8 = h_slurp(path, NULL);
  cr_assert_not_null(man8, "cannot read %s", path);
  cr_assert(strstr(man8, ".BR shardd.conf (5)"), "shardd.8 does not point to shardd.conf(5)");
  /* Defaults only (an empty file): the values the docs must show. */
  char empty[PATH_MAX];
  o_write(o_path(empty, sizeof empty, "empty.conf"), "");
  int st = o_run(out, sizeof out, NULL, shardd_bin(), "--check-config", "--config", empty, (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  int keys = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] == '#') continue;
    char key[128], value[1024] = "";
    if (sscanf(line, "%127s = %1023[^\n]", key, value) < 1) continue;
    keys++;
    if (strcmp(key, "root") && strcmp(key, "socket")) {
      /* Shipped as a commented default: "#key = default" (sizes may use a suffix). */
      char want[1300];
      snprintf(want, sizeof want, "\n#%s =", key);
      cr_assert(strstr(conf, want), "etc/shardd.conf.in does not list '%s' with its default", key);
      char def[1200];
      snprintf(def, sizeof def, "Default: %s", *value ? value : "empty");
      char *at = strstr(conf, want);
      /* The default is named in the comment just above the key. */
      char *block = at;
      while (block > conf && !(block[-1] == '\n' && block[0] == '\n')) block--;
      size_t n = (size_t)(at - block);
      char *para = strndup(block, n);
      /* copy_threads follows the machine's cores, max_open_files its descriptor limit: the docs say so
       * instead of a number. */
      int computed = (strcmp(key, "copy_threads") == 0 && strstr(para, "Default: the online cores")) ||
                     (strcmp(key, "max_open_files") == 0 && strstr(para, "Default: a quarter of"));
      cr_assert(strstr(para, def) || strstr(para, "Defaults:") || computed, "etc/shardd.conf.in: '%s' lacks '%s'", key,
                def);
      free(para);
    }
    /* shardd.conf.5 lists each key as a ".TP" entry, ".B key", then its flag. */
    char want[400], flag[400];
    snprintf(want, sizeof want, "\n.B %s\n", key);
    char *entry = strstr(man, want);
    cr_assert(entry, "shardd.conf.5 does not document key '%s' (as '.B %s')", key, key);
    size_t j = 0;
    j += (size_t)snprintf(flag, sizeof flag, "\\-\\-");
    for (const char *p = key; *p && j + 3 < sizeof flag; p++) {
      if (*p == '_') j += (size_t)snprintf(flag + j, sizeof flag - j, "\\-");
      else flag[j++] = *p;
    }
    flag[j] = '\0';
    char *next = strstr(entry + 1, "\n.TP\n");
    size_t n = next ? (size_t)(next - entry) : strlen(entry);
    char *para = strndup(entry, n);
    cr_assert(strstr(para, flag), "shardd.conf.5: key '%s' does not name its flag %s", key, flag);
    cr_assert(strstr(para, "Default"), "shardd.conf.5: key '%s' does not give its default", key);
    free(para);
  }
  cr_assert_geq(keys, 9, "--check-config printed only %d keys:\n%s", keys, out);
  free(conf);
  free(man);
  free(man8);
}
