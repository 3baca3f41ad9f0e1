/* placeholder */
typedef int sd_placeholder_;
