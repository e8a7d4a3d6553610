/* Unpinning a saved prefix (POST /v1/kv/unpin): the counterpart of
 * engine_kv_save, through the engine's public accessors only. */
#include "engine.h"

#include <stdlib.h>

int64_t engine_kv_unpin(engine *e, const int32_t *ids, int64_t n, const char *salt,
                        const float *lora, kvl_error *err) {
    kv_disk *d = engine_kv_disk(e);
    if (!d) {
        kvl_fail(err, "the KV disk tier is off (start with --kv-disk DIR)");
        return -1;
    }
    char *chain = engine_cache_salt(e, salt, lora, NULL, NULL);
    if (!chain) {
        kvl_fail(err, "engine: out of memory");
        return -1;
    }
    kv_seq s; /* only for its chain root: the salt's, as the save used */
    kv_seq_init(&s);
    kv_seq_set_cache_salt(&s, chain);
    free(chain);
    return kv_disk_unpin(d, s.chain_root, ids, n, err);
}
