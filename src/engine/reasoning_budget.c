/* engine: the reasoning budget (reasoning_budget.h). */
#include "reasoning_budget.h"

#include <stdlib.h>
#include <string.h>

enum rb_state { RB_IDLE, RB_COUNTING, RB_WAITING_UTF8, RB_FORCING, RB_DONE };

/* llama.cpp's token_matcher: true when tok completes the tag. */
static bool advance(const int32_t *tag, int n, int *pos, int32_t tok) {
    if (n == 0) return false;
    if (tok == tag[*pos]) {
        if (++*pos >= n) {
            *pos = 0;
            return true;
        }
    } else {
        *pos = tok == tag[0] ? 1 : 0;
    }
    return false;
}

static int32_t *copy(const int32_t *v, int n) {
    int32_t *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    if (c && n > 0) memcpy(c, v, (size_t)n * sizeof *c);
    return c;
}

/* A block opens: the budget counts down, or forces at once when it is 0. */
static void open_block(reasoning_budget *b) {
    b->remaining = b->budget;
    b->end_pos = 0;
    b->state = b->remaining <= 0 ? RB_FORCING : RB_COUNTING;
    b->force_pos = 0;
}

bool rb_init(reasoning_budget *b, int32_t budget, const int32_t *start, int n_start,
             const int32_t *end, int n_end, const int32_t *forced, int n_forced) {
    memset(b, 0, sizeof *b);
    if (budget < 0) return true;
    b->start = copy(start, n_start);
    b->end = copy(end, n_end);
    b->forced = copy(forced, n_forced);
    if (!b->start || !b->end || !b->forced) {
        rb_free(b);
        return false;
    }
    b->n_start = n_start, b->n_end = n_end, b->n_forced = n_forced;
    b->active = true;
    b->budget = budget;
    b->state = RB_IDLE;
    return true;
}

int64_t rb_prompt_tail(const reasoning_budget *b, const int32_t *prompt, int64_t n) {
    for (int64_t i = n - b->n_start; b->n_start > 0 && i >= 0; i--)
        if (memcmp(prompt + i, b->start, (size_t)b->n_start * sizeof *prompt) == 0) return i;
    return -1;
}

void rb_free(reasoning_budget *b) {
    free(b->start);
    free(b->end);
    free(b->forced);
    memset(b, 0, sizeof *b);
}

int32_t rb_forced(const reasoning_budget *b) {
    return b->active && b->state == RB_FORCING && b->force_pos < b->n_forced
               ? b->forced[b->force_pos]
               : -1;
}

void rb_accept(reasoning_budget *b, int32_t tok, bool utf8_complete) {
    if (!b->active) return;
    switch (b->state) {
    case RB_IDLE:
    case RB_DONE: /* a new block gets a fresh budget */
        if (advance(b->start, b->n_start, &b->start_pos, tok)) open_block(b);
        break;
    case RB_COUNTING:
    case RB_WAITING_UTF8:
        if (advance(b->end, b->n_end, &b->end_pos, tok)) { /* the model ended it */
            b->state = RB_DONE;
            break;
        }
        if (b->state == RB_WAITING_UTF8) {
            if (utf8_complete) b->state = RB_FORCING, b->force_pos = 0, b->end_pos = 0;
        } else if (--b->remaining <= 0) {
            b->state = utf8_complete ? RB_FORCING : RB_WAITING_UTF8;
            b->force_pos = 0;
            b->end_pos = 0;
        }
        break;
    case RB_FORCING:
        if (++b->force_pos >= b->n_forced) b->state = RB_DONE;
        break;
    }
    if (b->state == RB_FORCING && b->n_forced == 0) b->state = RB_DONE; /* nothing to force */
}

bool rb_force(reasoning_budget *b) {
    if (!b->active || b->state != RB_COUNTING) return false;
    b->state = b->n_forced ? RB_FORCING : RB_DONE;
    b->force_pos = 0;
    b->end_pos = 0;
    return true;
}

bool rb_utf8_complete(const char *bytes, size_t n) {
    if (n == 0) return true;
    for (size_t i = 1; i <= (n < 4 ? n : 4); i++) {
        const unsigned char c = (unsigned char)bytes[n - i];
        if ((c & 0xC0) != 0x80) {
            const size_t expected = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            return i >= expected;
        }
    }
    return false;
}
