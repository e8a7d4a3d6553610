/* units: parsing sizes and counts from flags, formatting byte counts. */
#ifndef KVLLM_UNITS_H
#define KVLLM_UNITS_H

#include "base.h"

/* Sizes as people write them: "80GiB", "16GB", "1.5 TiB", "2G", "123456" (bytes).
 * KB/MB/GB/TB/PB are decimal, KiB/MiB/GiB/TiB/PiB and a bare K/M/G/T/P binary
 * (case-insensitive). The result must be a whole number of bytes, at most
 * INT64_MAX. */
bool kvl_parse_size(const char *s, uint64_t *out);
/* Counts: "8192", "32K" (x1024, for token counts), "8B"/"7.24B", "70e9" (x1000
 * suffixes K/M/B/T when thousand is true, for parameter counts). Whole, >= 0. */
bool kvl_parse_count(const char *s, bool thousand, int64_t *out);
/* "171,798,691,840 B (160 GiB, 171.8 GB)": exact bytes, then the binary and the
 * decimal unit, each rounded to 2 decimals with trailing zeros dropped. */
const char *kvl_fmt_bytes(uint64_t bytes, char *buf, size_t cap);
/* The parts alone: "160 GiB" and "171.8 GB" ("640 B" below 1 KiB / 1 KB). */
const char *kvl_fmt_binary(uint64_t bytes, char *buf, size_t cap);
const char *kvl_fmt_decimal(uint64_t bytes, char *buf, size_t cap);

#endif
