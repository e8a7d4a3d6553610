#!/usr/bin/env python3
"""-hf user/model[:quant] (llama.cpp's flag) against a local stand-in for the Hugging Face API.

Usage: hub_check.py KVLLM_BIN REPO_ROOT OUT_DIR

The stand-in answers what huggingface.co answers to llama.cpp's -hf (api/models/REPO/refs,
api/models/REPO/tree/COMMIT?recursive=true, REPO/resolve/COMMIT/PATH redirected to a CDN path
that honours Range) with the bundled model under several names. Checked: the quantization
tag picks the file (Q4_K_M when none is given; never the projector), the download is resumed
after a broken transfer and lands in the Hugging Face cache layout (refs/main, blobs/OID,
snapshots/COMMIT/PATH -> ../../blobs/OID), the model generates what -m of the same file
generates, a second run and --offline read the cache without a request, an unreachable
endpoint falls back to the cache, a split model brings every part, a gated repository needs
HF_TOKEN, and a wrong checksum, a missing tag, an unknown repository, a malformed id and
-m with -hf are refused with a message naming them. Standard library only.
"""
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

BIN, ROOT, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
TOKEN = "hf_" + "a" * 34


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def git_oid(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


model = open(os.path.join(ROOT, "models", "stories260K.gguf"), "rb").read()
split_dir = os.path.join(OUT, "split")
os.makedirs(split_dir, exist_ok=True)
subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gguf_split.py"),
                os.path.join(ROOT, "models", "stories260K.gguf"), os.path.join(split_dir, "stories"), "20"],
               check=True, capture_output=True)
parts = sorted(f for f in os.listdir(split_dir) if f.endswith(".gguf"))
readme = b"# stories260K\n"
corrupt = bytearray(model)
corrupt[1000] ^= 1

# repository -> {path: bytes}; "oid" overrides for the damaged repository
REPOS = {
    "test/stories": {"README.md": readme, "stories260K-Q8_0.gguf": model, "stories260K-Q4_K_M.gguf": model,
                     "mmproj-stories-Q4_K_M.gguf": b"not a model",
                     **{f"split/{p}": open(os.path.join(split_dir, p), "rb").read() for p in parts}},
    "test/gated": {"stories260K-Q8_0.gguf": model},
    "test/damaged": {"stories260K-Q8_0.gguf": bytes(corrupt)},
    "test/oversize": {"stories260K-Q8_0.gguf": model},  # its listing says 100 bytes fewer
}
BLOBS = {}
for files in REPOS.values():
    for p, d in files.items():
        BLOBS[hashlib.sha256(d).hexdigest()] = d
FILES = {"stories260K-Q8_0.gguf": model, **{p: open(os.path.join(split_dir, p), "rb").read() for p in parts}}
DOCKER = {"ai/stories": {"latest": model, "260K-Q8_0": model}, "ai/damaged": {"latest": bytes(corrupt)}}
log = []          # (method, path, range) of every request
broken = set()    # oids whose first transfer is cut in the middle


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        log.append(("GET", path, self.headers.get("Range")))
        parts_ = path.strip("/").split("/")
        if parts_[:2] == ["api", "models"] and len(parts_) >= 5:
            repo = "/".join(parts_[2:4])
            if repo not in REPOS:
                return self.send(404, b'{"error": "Repository not found"}')
            if repo == "test/gated" and self.headers.get("Authorization") != "Bearer " + TOKEN:
                return self.send(401, b'{"error": "Access to model test/gated is restricted."}')
            if parts_[4] == "refs":
                return self.send(200, json.dumps({"branches": [
                    {"name": "dev", "ref": "refs/heads/dev", "targetCommit": OTHER},
                    {"name": "main", "ref": "refs/heads/main", "targetCommit": COMMIT}]}).encode())
            if parts_[4] == "tree" and parts_[5:] == [COMMIT] and query == "recursive=true":
                items = [{"type": "directory", "path": "split", "oid": "0" * 40, "size": 0},
                         {"type": "file", "path": "../evil.gguf", "oid": "1" * 40, "size": 4}]
                for p, d in REPOS[repo].items():
                    if p.endswith(".gguf"):
                        oid = hashlib.sha256(model if repo == "test/damaged" else d).hexdigest()
                        size = len(d) - (100 if repo == "test/oversize" else 0)
                        items.append({"type": "file", "path": p, "oid": git_oid(b"pointer " + p.encode()),
                                      "size": 130, "lfs": {"oid": oid, "size": size, "pointerSize": 130}})
                    else:
                        items.append({"type": "file", "path": p, "oid": git_oid(d), "size": len(d)})
                return self.send(200, json.dumps(items).encode())
            return self.send(404, b'{"error": "Revision not found"}')
        if len(parts_) >= 5 and parts_[2] == "resolve" and parts_[3] == COMMIT:
            repo, p = "/".join(parts_[:2]), "/".join(parts_[4:])
            d = REPOS.get(repo, {}).get(p)
            if d is None:
                return self.send(404, b"Entry not found", "text/plain")
            if repo == "test/gated" and self.headers.get("Authorization") != "Bearer " + TOKEN:
                return self.send(401, b"unauthorized", "text/plain")
            if not p.endswith(".gguf"):
                return self.send(200, d, "application/octet-stream")
            oid = hashlib.sha256(d).hexdigest()
            return self.send(302, b"", "text/plain", [("Location", f"/cdn/{oid}")])
        if parts_[0] == "token":  # Docker Hub's anonymous pull token (-dr)
            scope = query.split("scope=")[-1]
            return self.send(200, json.dumps({"token": "tok-" + scope.split(":")[1].replace("/", "_")}).encode())
        if parts_[:1] == ["v2"] and len(parts_) >= 5:  # Docker's registry: manifests, blobs
            repo, kind, ref = "/".join(parts_[1:-2]), parts_[-2], parts_[-1]
            want = "Bearer tok-" + repo.replace("/", "_")
            if self.headers.get("Authorization") != want:
                return self.send(401, b'{"errors": [{"code": "UNAUTHORIZED"}]}')
            if kind == "manifests" and repo in DOCKER and ref in DOCKER[repo]:
                d = DOCKER[repo][ref]
                return self.send(200, json.dumps({"schemaVersion": 2, "layers": [
                    {"mediaType": "application/vnd.docker.ai.license", "digest": "sha256:" + "0" * 64, "size": 4},
                    {"mediaType": "application/vnd.docker.ai.gguf.v3",
                     "digest": "sha256:" + hashlib.sha256(model).hexdigest(), "size": len(d)}]}).encode(),
                    "application/vnd.oci.image.manifest.v1+json")
            if kind == "blobs" and repo == "ai/damaged":  # not the bytes its manifest names
                return self.send(200, DOCKER[repo]["latest"], "application/octet-stream")
            if kind == "blobs" and ref.startswith("sha256:") and ref[7:] in BLOBS:
                return self.send(302, b"", "text/plain", [("Location", f"/cdn/{ref[7:]}")])
            return self.send(404, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}')
        if parts_[0] == "files" and len(parts_) == 2 and parts_[1] in FILES:  # -mu's plain URLs
            parts_ = ["cdn", hashlib.sha256(FILES[parts_[1]]).hexdigest()]
        if parts_[0] == "cdn" and len(parts_) == 2 and parts_[1] in BLOBS:
            d, oid = BLOBS[parts_[1]], parts_[1]
            rng = self.headers.get("Range")
            if rng:
                start = int(rng.split("=")[1].rstrip("-"))
                return self.send(206, d[start:], "application/octet-stream",
                                 [("Content-Range", f"bytes {start}-{len(d) - 1}/{len(d)}")])
            if oid in broken:  # the first transfer of this blob breaks half-way
                broken.discard(oid)
                self.send_response(200)
                self.send_header("Content-Length", str(len(d)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                self.wfile.write(d[:len(d) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            return self.send(200, d, "application/octet-stream", [("Accept-Ranges", "bytes")])
        self.send(404, b'{"error": "not found"}')


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
endpoint = f"http://127.0.0.1:{server.server_address[1]}"
cache = os.path.join(OUT, "cache")
shutil.rmtree(cache, ignore_errors=True)
ENV = dict(os.environ, MODEL_ENDPOINT=endpoint, LLAMA_CACHE=cache)
ENV.pop("HF_TOKEN", None)
GEN = ["-p", "Once upon a time", "-n", "12", "--temp", "0", "-c", "256"]


def kv(args, env=ENV):
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def text_of(p):
    return p.stdout.strip()


want = kv(["run", "-m", "models/stories260K.gguf"] + GEN)
oid = hashlib.sha256(model).hexdigest()
broken.add(oid)
n0 = len(log)
r = kv(["run", "-hf", "test/stories:Q8_0", "-v"] + GEN)
check(r.returncode == 0 and text_of(r) == text_of(want) and text_of(r),
      f"-hf test/stories:Q8_0 generates what -m generates ({r.stderr.strip()[-300:]})")
repo_dir = os.path.join(cache, "models--test--stories")
snap = os.path.join(repo_dir, "snapshots", COMMIT, "stories260K-Q8_0.gguf")
check(open(os.path.join(repo_dir, "refs", "main")).read().strip() == COMMIT if os.path.exists(
    os.path.join(repo_dir, "refs", "main")) else False, "refs/main holds the main branch's commit")
check(os.path.islink(snap) and os.readlink(snap) == f"../../blobs/{oid}",
      f"snapshots/COMMIT/stories260K-Q8_0.gguf -> ../../blobs/OID ({os.readlink(snap) if os.path.islink(snap) else 'missing'})")
cdn = [e for e in log[n0:] if e[1].startswith("/cdn/")]
check(len(cdn) == 2 and cdn[0][2] is None and cdn[1][2] == f"bytes={len(model) // 2}-",
      f"a broken transfer is resumed with a Range request ({cdn})")
check(not any(f.endswith(".incomplete") for f in os.listdir(os.path.join(repo_dir, "blobs"))),
      "no .incomplete file is left")

n0 = len(log)
r = kv(["run", "-hf", "test/stories:Q8_0"] + GEN)
check(r.returncode == 0 and text_of(r) == text_of(want) and not any(e[1].startswith("/cdn/") for e in log[n0:]),
      "a second run takes the file from the cache")
n0 = len(log)
r = kv(["run", "-hf", "test/stories:Q8_0", "--offline"] + GEN)
check(r.returncode == 0 and text_of(r) == text_of(want) and len(log) == n0, "--offline: the cache, no request")
dead = dict(ENV, MODEL_ENDPOINT="http://127.0.0.1:9")
r = kv(["run", "-hf", "test/stories:Q8_0"] + GEN, env=dead)
check(r.returncode == 0 and text_of(r) == text_of(want) and "looking in the cache" in r.stderr,
      f"an unreachable endpoint: the cache ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/stories:Q4_K_M", "--offline"] + GEN)
check(r.returncode != 0 and "not in the cache" not in r.stderr and "has no Q4_K_M GGUF file" in r.stderr,
      f"--offline with a file never downloaded: refused ({r.stderr.strip()[-200:]})")

r = kv(["run", "-hf", "test/stories", "-v"] + GEN)
check(r.returncode == 0 and f"snapshots/{COMMIT}/stories260K-Q4_K_M.gguf" in r.stderr,
      f"no tag: Q4_K_M ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/stories", "-hff", f"split/{parts[0]}", "-v"] + GEN)
split_snap = os.path.join(repo_dir, "snapshots", COMMIT, "split")
check(r.returncode == 0 and text_of(r) == text_of(want) and
      sorted(os.listdir(split_snap)) == parts if os.path.isdir(split_snap) else False,
      f"-hff a split model's first part: every part ({len(parts)}) downloaded, the model runs ({r.stderr.strip()[-200:]})")

r = kv(["run", "-hf", "test/stories:Q2_K"] + GEN)
check(r.returncode != 0 and "has no Q2_K GGUF file" in r.stderr and "stories260K-Q8_0.gguf" in r.stderr,
      f"a missing tag: refused, listing the GGUF files ({r.stderr.strip()[-300:]})")
r = kv(["run", "-hf", "test/nothing"] + GEN)
check(r.returncode != 0 and "HTTP 404" in r.stderr and "Repository not found" in r.stderr,
      f"an unknown repository: the endpoint's 404 ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/gated"] + GEN)
check(r.returncode != 0 and "HTTP 401" in r.stderr and "HF_TOKEN" in r.stderr,
      f"a gated repository without a token: refused naming HF_TOKEN ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/gated"] + GEN, env=dict(ENV, HF_TOKEN=TOKEN))
check(r.returncode == 0 and text_of(r) == text_of(want), f"with HF_TOKEN it downloads ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/damaged"] + GEN)
damaged = os.path.join(cache, "models--test--damaged")
check(r.returncode != 0 and "checksum" in r.stderr and
      not os.path.exists(os.path.join(damaged, "snapshots", COMMIT, "stories260K-Q8_0.gguf")) and
      not os.listdir(os.path.join(damaged, "blobs")) if os.path.isdir(os.path.join(damaged, "blobs")) else False,
      f"a wrong checksum: refused, nothing kept ({r.stderr.strip()[-200:]})")
r = kv(["run", "-hf", "test/oversize"] + GEN)
check(r.returncode != 0 and "sends more than" in r.stderr and
      not any(f.endswith(".incomplete") for f in os.listdir(os.path.join(cache, "models--test--oversize", "blobs"))),
      f"a file larger than its listing: stopped, nothing kept ({r.stderr.strip()[-160:]})")
for bad in ("test", "a/b/c", "../x/y", "te st/x", "a/b:Q4 K"):
    n0 = len(log)
    r = kv(["run", "-hf", bad] + GEN)
    check(r.returncode != 0 and "-hf" in r.stderr and len(log) == n0,
          f"-hf '{bad}': refused before any request ({r.stderr.strip()[-160:]})")
r = kv(["run", "-m", "models/stories260K.gguf", "-hf", "test/stories"] + GEN)
check(r.returncode != 0 and "give one" in r.stderr, "-m with -hf: refused")
r = kv(["run", "-hff", "x.gguf"] + GEN)
check(r.returncode != 0 and "give -hf too" in r.stderr, "-hff without -hf: refused")
# -mu URL (llama.cpp's): into llama.cpp's cache directory under the URL's file name, resumed
# after a broken transfer; then from there without a request; into -m's path when given; a
# split model's parts from the first part's URL
broken.add(oid)
n0 = len(log)
r = kv(["run", "-mu", f"{endpoint}/files/stories260K-Q8_0.gguf?download=true"] + GEN)
saved = os.path.join(cache, "stories260K-Q8_0.gguf")
files = [e for e in log[n0:] if e[1].startswith("/files/")]
check(r.returncode == 0 and text_of(r) == text_of(want) and os.path.exists(saved) and len(files) == 2
      and files[1][2] == f"bytes={len(model) // 2}-",
      f"-mu URL: into the cache, resumed, the model runs ({files}; {r.stderr.strip()[-200:]})")
n0 = len(log)
r = kv(["run", "-mu", f"{endpoint}/files/stories260K-Q8_0.gguf"] + GEN)
check(r.returncode == 0 and len(log) == n0, "-mu again: the saved file, no request")
mine = os.path.join(OUT, "mine.gguf")
if os.path.exists(mine):
    os.remove(mine)
r = kv(["run", "-mu", f"{endpoint}/files/stories260K-Q8_0.gguf", "-m", mine] + GEN)
check(r.returncode == 0 and open(mine, "rb").read() == model, "-mu with -m: saved as -m's path")
r = kv(["run", "-mu", f"{endpoint}/files/{parts[0]}"] + GEN)
check(r.returncode == 0 and text_of(r) == text_of(want) and
      all(os.path.exists(os.path.join(cache, p)) for p in parts), f"-mu of a split model's first part: every part")
for bad, why in ((f"{endpoint}/files/{parts[1]}", "give the URL of part 1"), ("ftp://x/m.gguf", "not an http"),
                 (f"{endpoint}/files/absent.gguf", "HTTP 404"), (f"{endpoint}/", "names no file")):
    r = kv(["run", "-mu", bad] + GEN)
    check(r.returncode != 0 and why in r.stderr, f"-mu {bad}: refused ({r.stderr.strip()[-160:]})")
check(not os.path.exists(os.path.join(cache, "absent.gguf.incomplete")), "a refused download leaves no file")

# --cache-list (-cl): the cached models as llama.cpp lists them, and nothing else done
r = kv(["run", "-cl"])
listed = r.stdout.splitlines()
check(r.returncode == 0 and listed[0].startswith("number of models in cache: ") and
      listed[1:] == ["   1. test/gated:Q8_0", "   2. test/stories:Q4_K_M", "   3. test/stories:Q8_0"],
      f"--cache-list ({listed})")
# -hfd: the draft model from the hub too (the model itself as draft: every draft accepted)
r = kv(["run", "-hf", "test/stories:Q8_0", "-hfd", "test/stories:Q4_K_M", "--offline", "-v"] + GEN)
check(r.returncode == 0 and text_of(r) == text_of(want) and "draft" in r.stderr.lower(),
      f"-hfd: the draft model from the cache ({r.stderr.strip()[-200:]})")

# -dr (llama.cpp's Docker Hub models): ai/ and latest by default, the GGUF layer's blob checked
# against its digest, saved as llama.cpp names it; then from there
denv = dict(ENV, KVLLM_DOCKER_AUTH=endpoint, KVLLM_DOCKER_REGISTRY=endpoint)
r = kv(["run", "-dr", "stories"] + GEN, env=denv)
check(r.returncode == 0 and text_of(r) == text_of(want) and os.path.exists(os.path.join(cache, "ai_stories_latest.gguf")),
      f"-dr stories: ai/stories:latest into the cache ({r.stderr.strip()[-200:]})")
r = kv(["run", "-dr", "ai/stories:260K-Q8_0", "--offline"] + GEN, env=denv)
check(r.returncode != 0 and "not in the cache" in r.stderr, "-dr --offline: only what is there")
n0 = len(log)
r = kv(["run", "-dr", "ai/stories"] + GEN, env=denv)
check(r.returncode == 0 and len(log) == n0, "-dr again: the saved file, no request")
r = kv(["run", "-dr", "ai/damaged"] + GEN, env=denv)
check(r.returncode != 0 and "checksum" in r.stderr and not os.path.exists(os.path.join(cache, "ai_damaged_latest.gguf")),
      f"-dr a blob that does not match its digest: refused, nothing kept ({r.stderr.strip()[-160:]})")
for bad, why in (("ai/none", "HTTP 404"), ("Upper/Case", "not a Docker repository"), ("a//b", "not a Docker repository")):
    r = kv(["run", "-dr", bad] + GEN, env=denv)
    check(r.returncode != 0 and why in r.stderr, f"-dr {bad}: refused ({r.stderr.strip()[-160:]})")

# serve: the model named as llama-server names it (the -hf argument), from the cache
import socket
import time
import urllib.request
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
sock.close()
srv = subprocess.Popen([BIN, "serve", "-hf", "test/stories:Q8_0", "--offline", "--port", str(port), "-c", "256"],
                       cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
models = None
for _ in range(100):
    try:
        models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5))
        break
    except Exception:
        time.sleep(0.1)
srv.terminate()
srv.wait(timeout=30)
check(models is not None and models["data"][0]["id"] == "test/stories:Q8_0",
      f"serve -hf: /v1/models names it test/stories:Q8_0 ({models and models['data'][0]['id']})")
server.shutdown()
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
