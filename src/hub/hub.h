/* hub: a model from a Hugging Face repository, as llama.cpp's `-hf
 * user/model[:QUANT]` finds it, kept in the Hugging Face cache layout that
 * huggingface-cli and llama.cpp share.
 *
 * The repository's branch (main, else its first) is resolved to a commit
 * (GET {endpoint}api/models/{repo}/refs), its files listed (.../tree/{commit}
 * ?recursive=true), and the model picked: the file named with -hff, else the
 * first .gguf whose name holds QUANT followed by '.' or '-' (case-insensitive;
 * no QUANT: Q4_K_M, then Q8_0, then the first model file), never a projector,
 * imatrix or MTP file. A split model brings all its parts. Each file lands in
 * {cache}/models--{user}--{model}/blobs/{oid} (downloaded to .incomplete,
 * resumed with a Range request after a broken transfer, checked against its
 * oid: SHA-256 for LFS files, git's blob SHA-1 for others) and is linked from
 * snapshots/{commit}/{path}. A file already there is not fetched again;
 * offline (or with the endpoint unreachable) the cached snapshot of the
 * branch serves.
 *
 * Environment, as llama.cpp and huggingface_hub read it: MODEL_ENDPOINT or
 * HF_ENDPOINT (default https://huggingface.co/), HF_TOKEN (a gated model's
 * token), and the cache directory from LLAMA_CACHE, HF_HUB_CACHE,
 * HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub or
 * ~/.cache/huggingface/hub. Everything the server sends is untrusted: repo
 * ids, commits, oids and paths are checked before they name a file. */
#ifndef KVLLM_HUB_H
#define KVLLM_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base.h"

typedef struct hub_request {
    const char *repo;  /* "user/model" or "user/model:QUANT" */
    const char *file;  /* a path in the repository (-hff), or NULL to pick by QUANT */
    const char *token; /* NULL: $HF_TOKEN */
    bool offline;      /* the cache only (llama.cpp's --offline) */
} hub_request;

/* The local path of the model's file (a split model's first part, the
 * others beside it) in path (cap bytes), downloading what the cache lacks;
 * progress on stderr. False with err saying what failed: the repository id,
 * the endpoint's answer, the file not found (with the GGUF files there), a
 * transfer, a checksum, the cache directory. */
bool hub_fetch(const hub_request *r, char *path, size_t cap, kvl_error *err);

/* llama.cpp's -mu URL: the file at an http(s) URL (every part, when its name
 * is a split model's first, -00001-of-0000N.gguf), saved as dest, or without
 * dest in llama.cpp's own cache directory (LLAMA_CACHE, else
 * XDG_CACHE_HOME/llama.cpp, else ~/.cache/llama.cpp) under the URL's file
 * name. A file already there is used as it is; offline, only that. There is
 * no checksum to hold it to: the transfer's length is checked. The local
 * path of the (first) file in path. */
bool hub_fetch_url(const char *url, const char *dest, const char *token, bool offline, char *path,
                   size_t cap, kvl_error *err);

/* llama.cpp's -dr [<repo>/]<model>[:tag]: a Docker Hub model (Docker Model
 * Runner's, ai/ the default repository, latest the default tag): an anonymous
 * pull token, the manifest's GGUF layer, its blob checked against the layer's
 * sha256 digest, saved in llama.cpp's cache directory as REPO_TAG.gguf (the
 * repository's '/' as '_'). A file already there is used as it is.
 * KVLLM_DOCKER_AUTH / KVLLM_DOCKER_REGISTRY name other endpoints (a mirror). */
bool hub_fetch_docker(const char *spec, bool offline, char *path, size_t cap, kvl_error *err);

/* llama.cpp's --cache-list: "number of models in cache: N" and one line
 * "   i. USER/MODEL:QUANT" for each model file of a cached snapshot (a split
 * model once; projectors and MTP files not), to out. */
void hub_list_cached(FILE *out);

#endif
