/* Placeholder until the command lands; replaced by its implementation. */
#include <stdio.h>

#include "cli.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvllm: this command is not implemented yet\n");
    return 1;
}
