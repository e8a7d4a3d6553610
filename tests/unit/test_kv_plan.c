/* KV capacity planner: every figure of docs/kv-figures.md in exact bytes (and
 * the seeds' rounded units), block rounding, metadata, budgets, the savings,
 * GGUF and config.json shapes (through the model layer's reader), unit
 * parsing (base/units.h), and agreement with the engine's
 * real block pools (kv_plan_measure: every KV type, split K/V types, sliding
 * windows). Run from the source root (CTest does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"
#include "kv_plan.h"
#include "hparams.h"

#include "check.h"

#define CHECK_U64(a, b)                                                                            \
    do {                                                                                           \
        unsigned long long a_ = (a), b_ = (b);                                                     \
        if (a_ != b_) {                                                                            \
            fprintf(stderr, "%s:%d: %s = %llu, want %llu\n", __FILE__, __LINE__, #a, a_, b_);      \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (strcmp(a_, b_) != 0) {                                                                 \
            fprintf(stderr, "%s:%d: %s = \"%s\", want \"%s\"\n", __FILE__, __LINE__, #a, a_, b_);  \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static kv_plan_model gqa(int64_t L, int64_t n_head, int64_t n_kv, int64_t d) {
    kv_plan_model m;
    kv_plan_model_init(&m);
    m.n_layers = L;
    m.n_head = n_head;
    m.n_kv_heads = n_kv;
    m.head_dim_k = m.head_dim_v = d;
    return m;
}

static kv_plan_request req(int64_t T, int64_t B, int dtype) {
    kv_plan_request r = {.context = T, .concurrency = B, .dtype = dtype, .block_size = 16};
    return r;
}

static kv_plan plan(const kv_plan_model *m, const kv_plan_request *r) {
    kv_plan p;
    kvl_error err = {{0}};
    memset(&p, 0, sizeof p);
    if (!kv_plan_compute(m, r, &p, &err)) {
        fprintf(stderr, "plan: %s\n", err.msg);
        failures++;
    }
    return p;
}

static const char *bin(uint64_t v) {
    static char b[4][32];
    static int i;
    i = (i + 1) % 4;
    return kvl_fmt_binary(v, b[i], sizeof b[i]);
}
static const char *dec(uint64_t v) {
    static char b[4][32];
    static int i;
    i = (i + 1) % 4;
    return kvl_fmt_decimal(v, b[i], sizeof b[i]);
}

/* ------------------------------------------------ kv-figures.md rows -- */

/* The rows of docs/kv-figures.md for GQA shapes: bytes per token and the
 * lower bound for a context T and batch B, exact, and as the document prints
 * them in binary and decimal units (NULL: not printed there). */
static const struct figure {
    const char *what;
    int64_t L, n_head, n_kv, d, T, B;
    int dtype;
    uint64_t per_token;
    const char *per_token_bin;
    uint64_t lower_bound;
    const char *lower_bound_bin, *lower_bound_dec;
} FIGURES[] = {
    {"Qwen3-32B", 64, 64, 8, 128, 32768, 1, KV_PLAN_F16, 262144, "256 KiB", 8589934592ull, "8 GiB",
     NULL},
    /* "약 160 GB" */
    {"Qwen3-32B x 20", 64, 64, 8, 128, 32768, 20, KV_PLAN_F16, 262144, "256 KiB", 171798691840ull,
     "160 GiB", NULL},
    /* MHA, 64 KV heads: 2 MiB/token, 64 GiB for one sequence, 1.25 TiB for 20. */
    {"Qwen3-32B as MHA", 64, 64, 64, 128, 32768, 1, KV_PLAN_F16, 2097152, "2 MiB", 68719476736ull,
     "64 GiB", NULL},
    {"Qwen3-32B as MHA x 20", 64, 64, 64, 128, 32768, 20, KV_PLAN_F16, 2097152, "2 MiB",
     1374389534720ull, "1.25 TiB", NULL},
    /* FP8 KV: "160 GB -> 80 GB". */
    {"Qwen3-32B fp8 x 20", 64, 64, 8, 128, 32768, 20, KV_PLAN_FP8, 131072, "128 KiB",
     85899345920ull, "80 GiB", NULL},
    /* "≈ 1.07 GB", and "34 GB" for 32 */
    {"Llama-3-8B", 32, 32, 8, 128, 8192, 1, KV_PLAN_F16, 131072, NULL, 1073741824ull, "1 GiB",
     "1.07 GB"},
    {"Llama-3-8B x 32", 32, 32, 8, 128, 8192, 32, KV_PLAN_F16, 131072, "128 KiB", 34359738368ull,
     NULL, "34.36 GB"},
    {"Llama-2-7B", 32, 32, 32, 128, 4096, 1, KV_PLAN_F16, 524288, "512 KiB", 2147483648ull, "2 GiB",
     NULL},
    {"Llama-2-7B 8K", 32, 32, 32, 128, 8192, 1, KV_PLAN_F16, 524288, NULL, 4294967296ull, "4 GiB",
     NULL},
    /* the GQA range: one token of 48 and 80 layers; the seed's "328 KB" */
    {"48 layers", 48, 64, 8, 128, 1, 1, KV_PLAN_F16, 196608, "192 KiB", 196608, NULL, NULL},
    {"80 layers", 80, 64, 8, 128, 1, 1, KV_PLAN_F16, 327680, "320 KiB", 327680, NULL, "327.68 KB"},
};

static void test_figures(void) {
    for (size_t i = 0; i < sizeof FIGURES / sizeof FIGURES[0]; i++) {
        const struct figure *f = &FIGURES[i];
        kv_plan_model m = gqa(f->L, f->n_head, f->n_kv, f->d);
        kv_plan_request r = req(f->T, f->B, f->dtype);
        kv_plan p = plan(&m, &r);
        CHECK(p.bytes_per_token == f->per_token, "%s: %llu bytes per token, want %llu", f->what,
              (unsigned long long)p.bytes_per_token, (unsigned long long)f->per_token);
        CHECK(p.lower_bound_bytes == f->lower_bound, "%s: lower bound %llu, want %llu", f->what,
              (unsigned long long)p.lower_bound_bytes, (unsigned long long)f->lower_bound);
        if (f->per_token_bin)
            CHECK(strcmp(bin(p.bytes_per_token), f->per_token_bin) == 0, "%s: %s per token",
                  f->what, bin(p.bytes_per_token));
        if (f->lower_bound_bin)
            CHECK(strcmp(bin(p.lower_bound_bytes), f->lower_bound_bin) == 0, "%s: %s", f->what,
                  bin(p.lower_bound_bytes));
        if (f->lower_bound_dec)
            CHECK(strcmp(dec(p.lower_bound_bytes), f->lower_bound_dec) == 0, "%s: %s", f->what,
                  dec(p.lower_bound_bytes));
    }
}

/* Qwen3-32B's blocks: T is a multiple of the block size, nothing is lost to rounding. */
static void test_qwen3_32b_blocks(void) {
    kv_plan_model m = gqa(64, 64, 8, 128);
    kv_plan_request r = req(32768, 20, KV_PLAN_F16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.allocated_bytes, p.lower_bound_bytes);
    CHECK_U64(p.blocks_per_seq, 2048);
    CHECK_U64(p.block_bytes, 64ull * 16 * 4096);
    /* fp8 is the pool's E4M3 with a static scale: 1 B per value, no scale bytes. */
    r.dtype = KV_PLAN_FP8;
    p = plan(&m, &r);
    CHECK_U64(p.block_bytes, 64ull * 16 * 2048);
    CHECK_U64(p.allocated_bytes, p.lower_bound_bytes);
}

static kv_plan_model deepseek_v3(void) {
    kv_plan_model m;
    kv_plan_model_init(&m);
    m.n_layers = 61;
    m.n_head = 128;
    m.n_kv_heads = 128;
    m.head_dim_k = m.head_dim_v = 56;
    m.kv_lora_rank = 512;
    m.rope_dim = 64;
    m.mha_head_dim_k = 128 + 64;
    m.mha_head_dim_v = 128;
    return m;
}

static void test_deepseek_v3_mla(void) {
    kv_plan_model m = deepseek_v3();
    kv_plan_request r = req(1, 1, KV_PLAN_BF16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.bytes_per_token, 70272); /* 576 x 61 x 2, "토큰당 약 70KB" */
    CHECK_STR(dec(p.bytes_per_token), "70.27 KB");
    CHECK_U64(p.v_row_bytes, 0);
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    int n = kv_plan_savings(&m, &r, s, KV_PLAN_MAX_SAVINGS);
    CHECK(n >= 1 && strcmp(s[0].what, "MLA") == 0);
    /* The MHA it replaces: 61 x 128 heads x (192 K + 128 V) x 2. */
    if (n >= 1) CHECK_U64(s[0].base_bytes_per_token, 61ull * 128 * 320 * 2);
}

/* ------------------------------------------------ rounding and budget -- */

static void test_block_rounding(void) {
    kv_plan_model m = gqa(5, 8, 4, 8); /* stories260K */
    kv_plan_request r = req(200, 3, KV_PLAN_F16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.bytes_per_token, 640);
    CHECK_U64(p.blocks_per_seq, 13); /* ceil(200/16) */
    CHECK_U64(p.block_bytes, 16 * 640);
    CHECK_U64(p.seq_allocated_bytes, 13 * 16 * 640);
    CHECK_U64(p.allocated_bytes, 3 * 13 * 16 * 640);
    CHECK_U64(p.lower_bound_bytes, 3 * 200 * 640);
    CHECK_U64(p.seq_metadata_bytes, 13 * KV_PLAN_BLOCK_ENTRY_BYTES + KV_PLAN_SEQ_HEADER_BYTES);
    CHECK_U64(p.metadata_bytes, 3 * p.seq_metadata_bytes);
    r.block_size = 1;
    p = plan(&m, &r);
    CHECK_U64(p.allocated_bytes, p.lower_bound_bytes);
}

static void test_budget(void) {
    /* Llama-3-8B, 8K context, 16 GB of weights, 80 GiB: (80 GiB - 16 GB) / (1 GiB + 2,112 B). */
    kv_plan_model m = gqa(32, 32, 8, 128);
    kv_plan_request r = req(8192, 1, KV_PLAN_F16);
    r.weights_bytes = 16000000000ull;
    r.budget_bytes = 80ull << 30;
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.seq_metadata_bytes, 512 * 4 + 64);
    CHECK_U64(p.max_concurrency, 65);
    CHECK(p.fits);
    r.concurrency = 65;
    p = plan(&m, &r);
    CHECK(p.fits && p.total_bytes <= r.budget_bytes);
    r.concurrency = 66;
    p = plan(&m, &r);
    CHECK(!p.fits && p.total_bytes > r.budget_bytes);
    CHECK_U64(p.max_concurrency, 65);
    /* The seed's batch of 32 (34 GB of KV + 16 GB) fits; weights over budget leave 0. */
    r.concurrency = 32;
    CHECK(plan(&m, &r).fits);
    r.budget_bytes = 15000000000ull;
    p = plan(&m, &r);
    CHECK(!p.fits && p.max_concurrency == 0);
}

/* ---------------------------------------------------- SWA, quant, MLA -- */

/* llama4-scout: 36 of 48 layers attend within chunks of 8192 and keep only
 * the current chunk's blocks; the other 12 keep everything. bf16, 4 KiB per
 * layer per token (8 KV heads x 128 x 2 x 2 B). */
static void test_chunked(void) {
    kv_plan_model m = gqa(48, 40, 8, 128);
    m.attn_chunk = 8192;
    m.n_chunk_layers = 36;
    kv_plan_request r = req(32768, 1, KV_PLAN_BF16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.bytes_per_token, 48 * 4096);
    CHECK_U64(p.chunk_block_bytes, 36ull * 16 * 4096);
    CHECK_U64(p.block_bytes, 12ull * 16 * 4096);
    CHECK_U64(p.chunk_blocks_per_seq, 512); /* 8192 / 16: chunks start on blocks */
    CHECK_U64(p.chunk_blocks_held, 512);    /* T = 4 chunks: the last one whole */
    CHECK_U64(p.lower_bound_bytes, 12ull * 4096 * 32768 + 36ull * 4096 * 8192);
    CHECK_U64(p.allocated_bytes,
              2048ull * 16 * 12 * 4096 + 512ull * 16 * 36 * 4096); /* 2.625 GiB */
    CHECK_U64(p.seq_metadata_bytes, 2 * 2048 * 4 + 64);            /* two KV groups, two tables */
    r.context = 32769; /* the first token of a new chunk: the previous one is gone */
    p = plan(&m, &r);
    CHECK_U64(p.chunk_blocks_held, 1);
    CHECK_U64(p.lower_bound_bytes, 12ull * 4096 * 32769 + 36ull * 4096 * 1);
    r.context = 131072;
    CHECK_U64(plan(&m, &r).allocated_bytes, 8192ull * 16 * 12 * 4096 + 512ull * 16 * 36 * 4096);
    r.context = 5000; /* shorter than a chunk: nothing dropped */
    p = plan(&m, &r);
    CHECK_U64(p.chunk_blocks_per_seq, 313);
    CHECK_U64(p.allocated_bytes, 313ull * 16 * 48 * 4096);
    r.context = 32768;
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    int n = kv_plan_savings(&m, &r, s, KV_PLAN_MAX_SAVINGS);
    bool found = false;
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].what, "chunked") == 0) {
            found = s[i].in_plan && s[i].base_allocated_bytes == 2048ull * 16 * 48 * 4096 &&
                    s[i].allocated_bytes == 2048ull * 16 * 12 * 4096 + 512ull * 16 * 36 * 4096;
        }
    CHECK(found);
    kvl_error err = {{0}};
    m.n_chunk_layers = 49; /* more than the layers */
    CHECK(!kv_plan_model_check(&m, &err) && strstr(err.msg, "attention chunk"));
    m.n_chunk_layers = 36;
    m.attn_chunk = 0;
    CHECK(!kv_plan_model_check(&m, &err) && strstr(err.msg, "without a chunk size"));
}

static void test_sliding_window(void) {
    kv_plan_model m = gqa(32, 32, 8, 128); /* Mistral-7B v0.1, W = 4096 in every layer */
    m.sliding_window = 4096;
    m.n_swa_layers = 32;
    kv_plan_request r = req(32768, 1, KV_PLAN_F16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.bytes_per_token, 131072);
    CHECK_U64(p.lower_bound_bytes, 4096ull * 131072); /* 512 MiB however long it runs */
    CHECK_U64(p.swa_blocks_per_seq, 257);             /* ceil(4095/16) + 1 */
    CHECK_U64(p.block_bytes, 0);
    CHECK_U64(p.allocated_bytes, 257ull * 16 * 131072);
    /* T and W block-aligned: after the T-th token only [T-W, T) is held, 256 blocks. */
    CHECK_U64(p.swa_blocks_held, 256);
    CHECK_U64(p.seq_held_bytes, 256ull * 16 * 131072);
    /* The table keeps an entry (-1 once dropped) for every position's block. */
    CHECK_U64(p.seq_metadata_bytes, 2048 * 4 + 64);
    r.context = 32769;
    CHECK_U64(plan(&m, &r).swa_blocks_held, 257);
    r.context = 65536;
    CHECK_U64(plan(&m, &r).lower_bound_bytes, 4096ull * 131072);
    r.context = 1000; /* shorter than the window: nothing capped */
    p = plan(&m, &r);
    CHECK_U64(p.lower_bound_bytes, 1000ull * 131072);
    CHECK_U64(p.swa_blocks_per_seq, 63);
    CHECK_U64(p.swa_blocks_held, 63);
    /* Half the layers slide (gemma-style): full layers keep T, sliding ones W. */
    m.n_swa_layers = 16;
    r.context = 32768;
    p = plan(&m, &r);
    CHECK_U64(p.lower_bound_bytes, 16ull * 4096 * 32768 + 16ull * 4096 * 4096);
    CHECK_U64(p.seq_metadata_bytes, 2 * 2048 * 4 + 64); /* two KV groups, two tables */
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    int n = kv_plan_savings(&m, &r, s, KV_PLAN_MAX_SAVINGS);
    bool found = false;
    for (int i = 0; i < n; i++) {
        if (strcmp(s[i].what, "SWA") != 0) continue;
        found = true;
        CHECK_U64(s[i].base_lower_bound_bytes, 131072ull * 32768);
        CHECK_U64(s[i].lower_bound_bytes, p.lower_bound_bytes);
    }
    CHECK(found);
}

/* Sliding layers of their own shape (Gemma 4 31B's layout: 10 full layers of 4 KV heads x
 * 512, 50 sliding ones of 16 x 256, window 1024), by hand: f16 rows of 4096 B (full K or V)
 * and 8192 B (sliding K or V). */
static void test_sliding_own_shape(void) {
    kv_plan_model m = gqa(60, 32, 4, 512);
    m.sliding_window = 1024;
    m.n_swa_layers = 50;
    m.n_kv_heads_swa = 16;
    m.head_dim_k_swa = m.head_dim_v_swa = 256;
    kv_plan_request r = req(32768, 1, KV_PLAN_F16);
    kv_plan p = plan(&m, &r);
    CHECK_U64(p.k_row_bytes, 4096);
    CHECK_U64(p.swa_k_row_bytes, 8192);
    CHECK_U64(p.bytes_per_token, 10ull * 8192 + 50ull * 16384);
    CHECK_U64(p.seq_lower_bound_bytes, 10ull * 8192 * 32768 + 50ull * 16384 * 1024);
    CHECK_U64(p.block_bytes, 16ull * 10 * 8192);
    CHECK_U64(p.swa_block_bytes, 16ull * 50 * 16384);
    kv_plan_group g[4];
    kvl_error err = {{0}};
    CHECK(kv_plan_pool_groups(&m, &r, g, &err) == 2);
    CHECK(g[0].cfg.n_kv_heads == 4 && g[0].cfg.head_dim_k == 512 && g[0].window == 0);
    CHECK(g[1].cfg.n_kv_heads == 16 && g[1].cfg.head_dim_k == 256 && g[1].window == 1024);
    /* SWA's saving: the same layers, each of its own shape, holding all 32768 positions (not
     * every layer in the full layers' shape, which would fold the shapes' difference into it) */
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    const int n = kv_plan_savings(&m, &r, s, KV_PLAN_MAX_SAVINGS);
    bool found = false;
    for (int i = 0; i < n; i++) {
        if (strcmp(s[i].what, "SWA") != 0) continue;
        found = true;
        CHECK_U64(s[i].base_bytes_per_token, p.bytes_per_token);
        CHECK_U64(s[i].base_lower_bound_bytes, (10ull * 8192 + 50ull * 16384) * 32768);
        CHECK_U64(s[i].lower_bound_bytes, p.lower_bound_bytes);
        CHECK(s[i].allocated_bytes < s[i].base_allocated_bytes);
    }
    CHECK(found);
    /* without the sliding shape: every layer as the full ones */
    kv_plan_model u = gqa(60, 32, 4, 512);
    u.sliding_window = 1024;
    u.n_swa_layers = 50;
    CHECK_U64(plan(&u, &r).swa_k_row_bytes, 4096);
}

static void test_quant(void) {
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_Q8_0, 1024), 32 * 34);
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_Q8_0, 33), 0); /* the pool refuses a partial block */
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_Q8_0, 48), 0);
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_FP8, 1024), 1024);
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_F32, 10), 40);
    CHECK_U64(kv_plan_row_bytes(KV_PLAN_BF16, 10), 20);
    /* Every type's sizes are the pool's. */
    for (int d = 0; d < KV_PLAN_DTYPE_COUNT; d++) {
        CHECK(kv_plan_pool_dtype(d) >= 0);
        CHECK_STR(kv_plan_dtype_name(d), kv_dtype_name(kv_plan_pool_dtype(d)));
        for (int64_t n = 1; n <= 4096; n *= 2)
            CHECK_U64(kv_plan_row_bytes(d, n), kv_row_bytes(kv_plan_pool_dtype(d), n));
    }
    /* q8_0 with a row that is not whole 32-value blocks: refused, as by the pool. */
    {
        kv_plan_model odd = gqa(2, 4, 1, 48);
        kv_plan_request rq = req(10, 1, KV_PLAN_Q8_0);
        kv_plan pq;
        kvl_error e = {{0}};
        CHECK(!kv_plan_compute(&odd, &rq, &pq, &e) && strstr(e.msg, "multiple of 32"));
        rq.dtype = KV_PLAN_F16; /* K f16, V q8_0: V's row is refused */
        rq.split_v = true;
        rq.dtype_v = KV_PLAN_Q8_0;
        CHECK(!kv_plan_compute(&odd, &rq, &pq, &e) && strstr(e.msg, "V row"));
    }
    /* Split K/V types: K q8_0, V fp8 (Llama-3-8B rows: 1024 values). */
    {
        kv_plan_model l8 = gqa(32, 32, 8, 128);
        kv_plan_request rs = req(8192, 1, KV_PLAN_Q8_0);
        rs.split_v = true;
        rs.dtype_v = KV_PLAN_FP8;
        kv_plan ps = plan(&l8, &rs);
        CHECK_U64(ps.k_row_bytes, 32 * 34);
        CHECK_U64(ps.v_row_bytes, 1024);
        CHECK_U64(ps.bytes_per_token, 32ull * (1088 + 1024));
        CHECK_U64(ps.block_bytes, 32ull * 16 * (1088 + 1024));
    }
    kv_plan_model m = gqa(64, 64, 8, 128);
    kv_plan_request r = req(32768, 20, KV_PLAN_F16);
    kv_plan_saving s[KV_PLAN_MAX_SAVINGS];
    int n = kv_plan_savings(&m, &r, s, KV_PLAN_MAX_SAVINGS);
    CHECK(n == 5); /* GQA, fp8, q8_0, q5_0, q4_0 */
    CHECK(n == 5 && strcmp(s[0].what, "GQA") == 0 && strcmp(s[1].what, "fp8") == 0 &&
          strcmp(s[2].what, "q8_0") == 0 && strcmp(s[3].what, "q5_0") == 0 &&
          strcmp(s[4].what, "q4_0") == 0);
    if (n == 5) {
        CHECK_U64(s[0].base_lower_bound_bytes, 1374389534720ull);
        CHECK_U64(s[1].base_lower_bound_bytes, 171798691840ull);
        CHECK_U64(s[1].lower_bound_bytes, 85899345920ull);
        CHECK_U64(s[2].bytes_per_token, 64ull * 2 * 1088);
        /* ggml's blocks of 32: q5_0 2 + 4 + 16 bytes, q4_0 2 + 16; 4 a head of 128 */
        CHECK_U64(s[3].bytes_per_token, 64ull * 2 * 8 * 4 * 22);
        CHECK_U64(s[4].bytes_per_token, 64ull * 2 * 8 * 4 * 18);
        CHECK_U64(s[4].base_bytes_per_token, 64ull * 2 * 8 * 128 * 2);
        CHECK(!s[1].in_plan && !s[2].in_plan && !s[3].in_plan && !s[4].in_plan && s[0].in_plan);
    }
    kv_plan_model mqa = gqa(32, 32, 1, 128);
    n = kv_plan_savings(&mqa, &r, s, KV_PLAN_MAX_SAVINGS);
    CHECK(n >= 1 && strcmp(s[0].what, "MQA") == 0);
    if (n >= 1) CHECK_U64(s[0].base_bytes_per_token / s[0].bytes_per_token, 32);
    CHECK(kv_plan_savings(&mqa, &r, s, 1) == 1);
}

/* ------------------------------------------------------- bad inputs -- */

static void test_invalid(void) {
    kv_plan_model m = gqa(32, 32, 8, 128);
    kv_plan_request r = req(0, 1, KV_PLAN_F16);
    kv_plan p;
    kvl_error err = {{0}};
    CHECK(!kv_plan_compute(&m, &r, &p, &err) && strstr(err.msg, "context"));
    r = req(8192, -1, KV_PLAN_F16);
    CHECK(!kv_plan_compute(&m, &r, &p, &err) && strstr(err.msg, "concurrency"));
    r = req(8192, 1, KV_PLAN_F16);
    r.block_size = 0;
    CHECK(!kv_plan_compute(&m, &r, &p, &err));
    r = req((int64_t)1 << 40, (int64_t)1 << 31, KV_PLAN_F32); /* bytes overflow 64 bits */
    kv_plan_model big = gqa(100000, 65536, 65536, 65536);
    CHECK(!kv_plan_compute(&big, &r, &p, &err) && strstr(err.msg, "64-bit"));
    kv_plan_model bad = gqa(0, 8, 8, 64);
    r = req(10, 1, KV_PLAN_F16);
    CHECK(!kv_plan_compute(&bad, &r, &p, &err) && strstr(err.msg, "layers"));
    bad = gqa(4, 8, 0, 64);
    CHECK(!kv_plan_compute(&bad, &r, &p, &err));
    bad = gqa(4, 8, 8, 64);
    bad.n_swa_layers = 2; /* sliding layers without a window */
    CHECK(!kv_plan_compute(&bad, &r, &p, &err));
}

/* ------------------------------------------------------ file formats -- */

/* config.json text through the model layer's reader into the planner's description. */
static bool from_hf(const char *json, kv_plan_model *m, kvl_error *err) {
    model_hparams hp;
    return model_hparams_from_hf_config(json, &hp, err) && model_hparams_plan_model(&hp, m, err);
}

/* A config.json (by its name) or a GGUF file through the model layer's
 * readers into the planner's description. */
static bool load_shape(const char *path, kv_plan_model *m) {
    kvl_error err = {{0}};
    model_hparams hp;
    bool ok;
    if (strlen(path) > 5 && strcmp(path + strlen(path) - 5, ".json") == 0) {
        char *text = kvl_read_file(path, NULL, &err);
        ok = text && model_hparams_from_hf_config(text, &hp, &err);
        free(text);
    } else {
        gguf_file *f = gguf_open(path, &err);
        ok = f && model_hparams_from_gguf(f, &hp, &err);
        gguf_close(f);
    }
    ok = ok && model_hparams_plan_model(&hp, m, &err);
    if (!ok) fprintf(stderr, "%s: %s\n", path, err.msg);
    return ok;
}

static void test_hf_configs(void) {
    kv_plan_model m;
    CHECK(load_shape("tests/kv_plan/qwen3-32b.json", &m));
    CHECK(m.n_layers == 64 && m.n_head == 64 && m.n_kv_heads == 8 && m.head_dim_k == 128);
    CHECK(m.n_swa_layers == 0 && m.kv_dtype == KV_PLAN_BF16 && m.param_bytes == 2);
    CHECK(load_shape("tests/kv_plan/llama-3-8b.json", &m));
    CHECK(m.n_layers == 32 && m.n_kv_heads == 8 && m.head_dim_k == 128 && m.head_dim_v == 128);
    CHECK(load_shape("tests/kv_plan/llama-2-7b.json", &m));
    CHECK(m.n_kv_heads == 32 && m.kv_dtype == KV_PLAN_F16);
    CHECK(load_shape("tests/kv_plan/llama-3-70b.json", &m));
    CHECK(m.n_layers == 80 && m.n_kv_heads == 8 && m.head_dim_k == 128);
    CHECK(load_shape("tests/kv_plan/deepseek-v3.json", &m));
    CHECK(m.n_layers == 61 && m.kv_lora_rank == 512 && m.rope_dim == 64);
    CHECK(m.mha_head_dim_k == 192 && m.mha_head_dim_v == 128 && m.n_head == 128);
    kv_plan_request r = req(1, 1, KV_PLAN_BF16);
    CHECK_U64(plan(&m, &r).bytes_per_token, 70272);
    CHECK(load_shape("tests/kv_plan/mistral-7b-v0.1.json", &m));
    CHECK(m.sliding_window == 4096 && m.n_swa_layers == 32);
    CHECK(load_shape("tests/kv_plan/synthetic-layer-types.json", &m));
    CHECK(m.sliding_window == 512 && m.n_swa_layers == 5 && m.n_layers == 6);
    /* Gemma 4's fields: 8 layers with a cache, 6 of them sliding (layers 0-4, 6), full ones of
     * 2 x 512, sliding ones of 8 x 256; bf16: 2 x 2 x 512 x 2 B a full layer, 2 x 8 x 256 x 2 B
     * a sliding one */
    CHECK(load_shape("tests/kv_plan/synthetic-gemma4.json", &m));
    CHECK(m.n_layers == 8 && m.n_swa_layers == 6 && m.sliding_window == 1024);
    CHECK(m.n_layers_shared_kv == 4); /* num_kv_shared_layers: no cache of their own */
    CHECK(m.n_kv_heads == 2 && m.head_dim_k == 512 && m.n_kv_heads_swa == 8 &&
          m.head_dim_k_swa == 256 && m.head_dim_v_swa == 256);
    {
        kv_plan_request rg = req(4096, 1, KV_PLAN_BF16);
        CHECK_U64(plan(&m, &rg).bytes_per_token, 2ull * 4096 + 6ull * 8192);
        CHECK_U64(plan(&m, &rg).seq_lower_bound_bytes, 2ull * 4096 * 4096 + 6ull * 8192 * 1024);
    }
    kvl_error err = {{0}};
    CHECK(!from_hf("{\"num_hidden_layers\": 2}", &m, &err));
    CHECK(strstr(err.msg, "num_attention_heads") != NULL);
    CHECK(!from_hf("{\"num_hidden_layers\": -2, \"num_attention_heads\": 4,"
                   "\"hidden_size\": 64}",
                   &m, &err));
    CHECK(!from_hf("[1,2]", &m, &err));
    CHECK(!from_hf("{\"num_hidden_layers\": 2, \"num_attention_heads\": 3, "
                   "\"hidden_size\": 64}",
                   &m, &err)); /* 64 % 3 */
    CHECK(from_hf("{\"text_config\": {\"num_hidden_layers\": 12, "
                  "\"num_attention_heads\": 8, \"num_key_value_heads\": 4, "
                  "\"head_dim\": 256, \"sliding_window\": 1024, "
                  "\"model_type\": \"gemma3_text\"}}",
                  &m, &err));
    CHECK(m.n_layers == 12 && m.n_swa_layers == 10); /* gemma3's default: 5 local, 1 global */
}

static void test_gguf(void) {
    kv_plan_model m;
    CHECK(load_shape("models/stories260K.gguf", &m));
    CHECK(m.n_layers == 5 && m.n_head == 8 && m.n_kv_heads == 4 && m.head_dim_k == 8);
    CHECK(m.weights_bytes > 0 && strcmp(m.arch, "llama") == 0);
    CHECK(load_shape("tests/data/golden/models/gemma3-swa-f32.gguf", &m));
    CHECK(m.sliding_window == 16 && m.n_swa_layers == 2 && m.n_layers == 4); /* pattern 2 */
    CHECK(m.n_layers_shared_kv == 0);
    /* Gemma 4 E2B's layout: 6 layers, the last 2 reading layers 2 and 3's caches; 2 sliding
     * layers of 2 KV heads x 16 and 2 full ones of 1 x 32 keep one */
    CHECK(load_shape("tests/data/golden/models/gemma4-e2b-f32.gguf", &m));
    CHECK(m.n_layers == 4 && m.n_layers_shared_kv == 2 && m.n_swa_layers == 2);
    CHECK(m.n_kv_heads == 1 && m.head_dim_k == 32 && m.n_kv_heads_swa == 2 &&
          m.head_dim_k_swa == 16);
    CHECK(load_shape("tests/data/golden/models/deepseek2-mla-f32.gguf", &m));
    CHECK(m.kv_lora_rank == 32 && m.rope_dim == 16 && m.mha_head_dim_k == 48 &&
          m.mha_head_dim_v == 32);
    kv_plan_request r = req(10, 1, KV_PLAN_F32);
    CHECK_U64(plan(&m, &r).bytes_per_token, 2 * 48 * 4);
}

/* ---------------------------------------------- against the real pool -- */

/* The plan against a replay through the engine's pools of the planner's groups:
 * block bytes, peak and end blocks per group, lower bound, allocation. */
static void check_measured(const kv_plan_model *m, const kv_plan_request *r) {
    kv_plan_group groups[KV_PLAN_MAX_GROUPS];
    kv_plan_measured meas;
    kvl_error err = {{0}};
    kv_plan p = plan(m, r);
    int n = kv_plan_pool_groups(m, r, groups, &err);
    CHECK(n == (m->n_layers > m->n_swa_layers + m->n_chunk_layers) + (m->n_swa_layers > 0) +
                   (m->n_chunk_layers > 0));
    if (n == 0 || !kv_plan_measure(groups, n, r->context, r->concurrency, 1 << 28, &meas, &err)) {
        fprintf(stderr, "measure (T %lld, bs %lld, W %lld, C %lld): %s\n", (long long)r->context,
                (long long)r->block_size, (long long)m->sliding_window, (long long)m->attn_chunk,
                err.msg);
        failures++;
        return;
    }
    int64_t B = r->concurrency;
    CHECK(meas.n_groups == n);
    for (int g = 0; g < meas.n_groups; g++) {
        const kv_plan_measured_group *mg = &meas.group[g];
        int k = mg->window > 0 ? 1 : mg->chunk > 0 ? 2 : 0;
        const uint64_t bb[3] = {p.block_bytes, p.swa_block_bytes, p.chunk_block_bytes};
        const int64_t peak[3] = {p.blocks_per_seq, p.swa_blocks_per_seq, p.chunk_blocks_per_seq};
        const int64_t end[3] = {p.blocks_per_seq, p.swa_blocks_held, p.chunk_blocks_held};
        CHECK_U64(mg->block_bytes, bb[k]);
        CHECK_U64(mg->peak_blocks, peak[k] * B);
        CHECK_U64(mg->blocks, end[k] * B);
    }
    CHECK_U64(meas.lower_bound_bytes, p.lower_bound_bytes);
    CHECK_U64(meas.peak_allocated_bytes, p.allocated_bytes);
    CHECK_U64(meas.allocated_bytes, p.seq_held_bytes * (uint64_t)B);
}

static void test_measure(void) {
    kv_plan_model m = gqa(5, 8, 4, 8); /* stories260K: 32-value rows */
    int64_t ctx[] = {1, 15, 16, 17, 200, 2048};
    for (int d = 0; d < KV_PLAN_DTYPE_COUNT; d++) {
        for (int t = 0; t < 6; t++) {
            kv_plan_request r = req(ctx[t], 3, d);
            check_measured(&m, &r);
            r.block_size = 7;
            check_measured(&m, &r);
            r.split_v = true; /* V as the next type: every K/V pairing */
            r.dtype_v = (d + 1) % KV_PLAN_DTYPE_COUNT;
            check_measured(&m, &r);
        }
    }
    kv_plan_model mla = deepseek_v3();
    mla.n_layers = 2;
    kv_plan_request r = req(100, 2, KV_PLAN_F16);
    check_measured(&mla, &r);
    r.dtype = KV_PLAN_Q8_0; /* 576-value latent rows: 18 blocks */
    check_measured(&mla, &r);
    r.dtype = KV_PLAN_F16;
    kv_plan_model uneven = gqa(2, 8, 2, 32);
    uneven.head_dim_v = 16;
    check_measured(&uneven, &r);
    /* Sliding windows: gemma-style half the layers, Mistral-style all of them;
     * windows aligned and not, shorter and longer than T, block sizes 16 and 7. */
    int64_t windows[] = {1, 16, 17, 40};
    int64_t ctx2[] = {1, 15, 16, 17, 33, 160, 161, 1000};
    for (int w = 0; w < 4; w++) {
        for (int t = 0; t < 8; t++) {
            for (int all = 0; all < 2; all++) {
                kv_plan_model s = gqa(4, 4, 2, 32);
                s.sliding_window = windows[w];
                s.n_swa_layers = all ? 4 : 2;
                kv_plan_request rs = req(ctx2[t], 2, t % 2 ? KV_PLAN_Q8_0 : KV_PLAN_FP8);
                check_measured(&s, &rs);
                rs.block_size = 7;
                check_measured(&s, &rs);
            }
        }
    }
    /* Chunked layers (llama4: 3 of 4), with and without a sliding group: chunks
     * block-aligned (16, 32) and not (7, 24 with blocks of 7), shorter and
     * longer than T; the peak and the blocks at T replayed through the pools. */
    int64_t chunks[] = {7, 16, 24, 32};
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 8; t++) {
            kv_plan_model s = gqa(4, 4, 2, 32);
            s.attn_chunk = chunks[c];
            s.n_chunk_layers = 3;
            kv_plan_request rs = req(ctx2[t], 2, KV_PLAN_F16);
            check_measured(&s, &rs);
            rs.block_size = 7;
            check_measured(&s, &rs);
            s.sliding_window = 9; /* full, sliding and chunked: three groups */
            s.n_swa_layers = 1;
            s.n_chunk_layers = 2;
            check_measured(&s, &rs);
        }
    kv_plan_group groups[KV_PLAN_MAX_GROUPS];
    kvl_error err = {{0}};
    kv_plan_measured meas;
    r = req(100, 1, KV_PLAN_F16);
    int n = kv_plan_pool_groups(&m, &r, groups, &err);
    CHECK(n == 1);
    CHECK(!kv_plan_measure(groups, n, 1 << 20, 1000, 1 << 20, &meas, &err)); /* over the limit */
    kv_plan_model odd = gqa(2, 4, 1, 48);
    r.dtype = KV_PLAN_Q8_0;
    CHECK(kv_plan_pool_groups(&odd, &r, groups, &err) == 0 && strstr(err.msg, "multiple of 32"));
}

/* The last step's chunk: a prefill of c tokens holds the blocks of
 * [T - c - W + 1, T); checked against the real pool doing what engine.c does. */
static void test_swa_held_chunk(void) {
    kv_plan_model s = gqa(2, 4, 2, 32);
    s.sliding_window = 16;
    s.n_swa_layers = 2;
    kv_plan_request r = req(1, 1, KV_PLAN_F16);
    kv_plan_group groups[KV_PLAN_MAX_GROUPS];
    kvl_error err = {{0}};
    CHECK(kv_plan_pool_groups(&s, &r, groups, &err) == 1);
    groups[0].cfg.n_blocks = 64;
    kv_pool *pool = kv_pool_create(&groups[0].cfg, &err);
    CHECK(pool != NULL);
    for (int64_t T = 1; pool && T <= 200; T += 3) {
        for (int64_t c = 1; c <= T; c += 5) {
            kv_seq q;
            kv_seq_init(&q);
            /* T - c tokens decoded one per step, then one chunk of c. */
            for (int64_t p = 0; p < T - c; p++) {
                kv_seq_drop_before(pool, &q, p - 16 + 1);
                CHECK(kv_seq_reserve(pool, &q, p + 1));
            }
            kv_seq_drop_before(pool, &q, T - c - 16 + 1);
            CHECK(kv_seq_reserve(pool, &q, T));
            CHECK_U64(kv_seq_n_held(&q), kv_plan_blocks_held((kv_attn){16, 0}, 16, T, c));
            kv_seq_free(pool, &q);
        }
    }
    kv_pool_destroy(pool);
    CHECK_U64(kv_plan_blocks_held((kv_attn){16, 0}, 16, 160, 1), 1); /* T = 10 W: aligned */
    CHECK_U64(kv_plan_blocks_held((kv_attn){16, 0}, 16, 161, 1), 2);
    CHECK_U64(kv_plan_blocks_held((kv_attn){16, 0}, 16, 40, 40), 3); /* a prefill holds it all */
    /* chunks of 32: a 40-token prefill holds all 3 blocks; decoding, only the
     * current chunk's (positions 32..39: 1 block); at 64 a new chunk begins */
    CHECK_U64(kv_plan_blocks_held((kv_attn){0, 32}, 16, 40, 40), 3);
    CHECK_U64(kv_plan_blocks_held((kv_attn){0, 32}, 16, 40, 1), 1);
    CHECK_U64(kv_plan_blocks_held((kv_attn){0, 32}, 16, 64, 1), 2);
    CHECK_U64(kv_plan_blocks_held((kv_attn){0, 32}, 16, 65, 1), 1);
}

/* ------------------------------------------------------ units, format -- */

static void test_parse(void) {
    uint64_t v;
    int64_t c;
    CHECK(kvl_parse_size("80GiB", &v) && v == 85899345920ull);
    CHECK(kvl_parse_size("16GB", &v) && v == 16000000000ull);
    CHECK(kvl_parse_size("1.5 TiB", &v) && v == 1649267441664ull);
    CHECK(kvl_parse_size("1073741824", &v) && v == 1073741824ull);
    CHECK(kvl_parse_size("1.07gb", &v) && v == 1070000000ull);
    CHECK(kvl_parse_size("2G", &v) && v == 2147483648ull); /* bare letters: binary */
    CHECK(kvl_parse_size("512m", &v) && v == 536870912ull);
    CHECK(kvl_parse_size("1.5G", &v) && v == 1610612736ull);
    CHECK(!kvl_parse_size("1.3G", &v));   /* not whole bytes */
    CHECK(!kvl_parse_size("0.1KiB", &v)); /* 102.4 bytes */
    CHECK(!kvl_parse_size("-5GB", &v));
    CHECK(!kvl_parse_size("5 GX", &v));
    CHECK(!kvl_parse_size("", &v));
    CHECK(!kvl_parse_size("99999999999PiB", &v));
    CHECK(kvl_parse_count("32K", false, &c) && c == 32768);
    CHECK(kvl_parse_count("8192", false, &c) && c == 8192);
    CHECK(kvl_parse_count("8.03B", true, &c) && c == 8030000000ll);
    CHECK(kvl_parse_count("70e9", true, &c) && c == 70000000000ll);
    CHECK(!kvl_parse_count("-1", false, &c));
    CHECK(!kvl_parse_count("1.5", false, &c));
    CHECK(!kvl_parse_count("12abc", false, &c));
    int dt;
    CHECK(kv_plan_dtype_parse("q8_0", &dt) && dt == KV_PLAN_Q8_0);
    CHECK(kv_plan_dtype_parse("FP8", &dt) && dt == KV_PLAN_FP8);
    CHECK(kv_plan_dtype_parse("fp8_e4m3", &dt) && dt == KV_PLAN_FP8);
    CHECK(kv_plan_dtype_parse("bf16", &dt) && dt == KV_PLAN_BF16);
    CHECK_STR(kv_plan_dtype_name(KV_PLAN_Q8_0), "q8_0");
    CHECK_STR(kv_plan_dtype_name(KV_PLAN_FP8), "fp8");
    CHECK(kv_plan_dtype_parse("q4_0", &dt) && dt == KV_PLAN_Q4_0);
    CHECK(kv_plan_row_bytes(KV_PLAN_Q4_0, 64) == 36 && kv_plan_row_bytes(KV_PLAN_Q5_0, 64) == 44 &&
          kv_plan_row_bytes(KV_PLAN_IQ4_NL, 48) == 0);
    CHECK(!kv_plan_dtype_parse("q4_1", &dt) && !kv_plan_dtype_parse("int4", &dt));
}

static void test_format(void) {
    char buf[96];
    CHECK_STR(kvl_fmt_bytes(171798691840ull, buf, sizeof buf),
              "171,798,691,840 B (160 GiB, 171.8 GB)");
    CHECK_STR(kvl_fmt_bytes(640, buf, sizeof buf), "640 B");
    CHECK_STR(kvl_fmt_bytes(1024, buf, sizeof buf), "1,024 B (1 KiB, 1.02 KB)");
    CHECK_STR(bin(1374389534720ull), "1.25 TiB");
    CHECK_STR(dec(1374389534720ull), "1.37 TB");
    CHECK_STR(bin(70272), "68.62 KiB");
    CHECK_STR(bin(0), "0 B");
}

int main(void) {
    test_figures();
    test_qwen3_32b_blocks();
    test_deepseek_v3_mla();
    test_block_rounding();
    test_budget();
    test_sliding_window();
    test_chunked();
    test_quant();
    test_sliding_own_shape();
    test_invalid();
    test_hf_configs();
    test_gguf();
    test_measure();
    test_swa_held_chunk();
    test_parse();
    test_format();
    if (failures) {
        fprintf(stderr, "test_kv_plan: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_kv_plan: ok\n");
    return 0;
}
