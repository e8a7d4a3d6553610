/* cli_json_fields: JSON members from a table of struct fields (cli.h). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

void cli_json_u64(cJSON *j, const char *name, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    cJSON_AddRawToObject(j, name, buf);
}

/* An integer field as a number, or exactly (negative ones as their uint64_t). */
static void add_int(cJSON *j, const char *name, uint64_t bits, double value, bool exact) {
    if (exact) cli_json_u64(j, name, bits);
    else cJSON_AddNumberToObject(j, name, value);
}

void cli_json_fields(cJSON *j, const void *base, const cli_json_field *f, size_t n, bool exact) {
    for (size_t i = 0; i < n; i++) {
        const void *at = (const char *)base + f[i].offset;
        const char *name = f[i].name;
        switch (f[i].kind) {
        case CLI_JSON_BOOL: cJSON_AddBoolToObject(j, name, *(const bool *)at); break;
        case CLI_JSON_INT: {
            const int v = *(const int *)at;
            add_int(j, name, (uint64_t)v, (double)v, exact);
            break;
        }
        case CLI_JSON_I64: {
            const int64_t v = *(const int64_t *)at;
            add_int(j, name, (uint64_t)v, (double)v, exact);
            break;
        }
        case CLI_JSON_U64: {
            const uint64_t v = *(const uint64_t *)at;
            add_int(j, name, v, (double)v, exact);
            break;
        }
        case CLI_JSON_F32: cJSON_AddNumberToObject(j, name, *(const float *)at); break;
        case CLI_JSON_CHARS: cJSON_AddStringToObject(j, name, (const char *)at); break;
        }
    }
}
