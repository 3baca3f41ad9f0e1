/* placeholder: dtype.c is being written. */
typedef int sd_placeholder_dtype_;
