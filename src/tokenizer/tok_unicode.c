/* Codepoint classes, UTF-8 coding and the GPT-2 byte map (see tok_unicode.h). */
#include "tok_unicode.h"

uint16_t tok_uflags(uint32_t cp) {
    if (cp >= 0x110000) {
        return TOK_UF_UNDEFINED;
    }
    /* Binary search for the last range starting at or before cp. */
    size_t lo = 0, hi = tok_unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (tok_unicode_ranges[mid].start <= cp) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return tok_unicode_ranges[lo].flags;
}

static int is_cont(const char *s, size_t len, size_t i) {
    return i < len && ((unsigned char)s[i] & 0xC0) == 0x80;
}

uint32_t tok_utf8_next(const char *s, size_t len, size_t *off) {
    size_t i = *off;
    const unsigned char b0 = (unsigned char)s[i];
    if (b0 < 0x80) {
        *off = i + 1;
        return b0;
    }
    if ((b0 & 0xE0) == 0xC0 && is_cont(s, len, i + 1)) {
        *off = i + 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
    }
    if ((b0 & 0xF0) == 0xE0 && is_cont(s, len, i + 1) && is_cont(s, len, i + 2)) {
        *off = i + 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 6) |
               ((unsigned char)s[i + 2] & 0x3F);
    }
    if ((b0 & 0xF8) == 0xF0 && is_cont(s, len, i + 1) && is_cont(s, len, i + 2) &&
        is_cont(s, len, i + 3)) {
        *off = i + 4;
        return ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)((unsigned char)s[i + 1] & 0x3F) << 12) |
               ((uint32_t)((unsigned char)s[i + 2] & 0x3F) << 6) | ((unsigned char)s[i + 3] & 0x3F);
    }
    *off = i + 1;
    return 0xFFFD;
}

size_t tok_utf8_put(uint32_t cp, char *out) {
    if (cp > 0x10FFFF) {
        cp = 0xFFFD;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 keeps printable Latin-1 bytes as their own codepoint and moves the other
 * 68 bytes, in byte order, to U+0100.. so every byte has a visible character. */
static int byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) {
        return b;
    }
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++) {
        n += !byte_is_printable(c);
    }
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) {
        return byte_is_printable(cp) ? (int)cp : -1;
    }
    uint32_t n = cp - 256;
    for (unsigned c = 0; c < 256; c++) {
        if (!byte_is_printable(c) && n-- == 0) {
            return (int)c;
        }
    }
    return -1;
}
