/* placeholder: plan.c is being written. */
typedef int sd_placeholder_plan_;
