/* placeholder: linebuf.c is being written. */
typedef int sd_placeholder_linebuf_;
