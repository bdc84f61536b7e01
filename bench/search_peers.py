#!/usr/bin/env python3
"""Peer figures for `mtrl bench search --peer FILE`: the same corpus, machine, cores and threads.

What a user would otherwise run: bm25s (numba and numpy backends, Lucene BM25 k1 1.2 b 0.75,
English stop words, Snowball English stemmer from PyStemmer), sentence-transformers
all-MiniLM-L6-v2 (max_seq_length 256, batch 64, unit vectors) and hnswlib (M 16,
ef_construction 200, seed 100, inner product on the unit vectors).

  python3 -m venv .venv-peer
  .venv-peer/bin/pip install torch==2.15.0 sentence-transformers==6.2.0 hnswlib==0.8.0 \
      bm25s==0.3.16 PyStemmer==3.1.0 numba==0.68.1    # tested with these (Python 3.11.7)
  .venv-peer/bin/python bench/search_peers.py --docs data/vaswani/docs.tsv.gz \
      --queries data/vaswani/queries.tsv --qrels data/vaswani/qrels.tsv \
      --model models/all-minilm-l6-v2 --threads 2 --encode-docs 2000 --out /tmp/peer.json

Two stages, in this order: (1) index: read the corpus, build both bm25s indexes, load MiniLM,
time document encoding, embed the whole corpus, build the HNSW graph; (2) serve: every query
timing, the exact top-k for recall, and nDCG. Everything is one query at a time on one Python
thread; MiniLM runs with torch's `--threads` intra-op threads, bm25s retrieval with n_threads=1,
hnswlib queries with 1 thread (its build with `--threads`). The process is pinned to the first
`--threads` allowed CPUs (os.sched_setaffinity) and OMP/MKL/OPENBLAS/NUMBA_NUM_THREADS are set
before numpy/torch are imported. Latency percentiles use mtrl's rule: sorted[round((n-1)*p)].

Inputs follow mtrl-search's readers (crates/mtrl-search/src/{corpus,queries,qrels}.rs):
- docs: .jsonl/.ndjson, .tsv/.tab (no quoting) or .csv (RFC 4180), each optionally .gz; fields
  `title` and `text`, id from --id-column (default: the first of id, doc_id, _id, docno present).
  A bad row (malformed, empty id, empty document, repeated id) is skipped and counted, as mtrl
  does with skip_bad_rows = true (Cranfield's docs 471 and 995 are empty). The indexed and
  embedded text is mtrl's Document::indexed_text: `title + "\n" + text`, or just `text` when it
  already starts with the title (Cranfield), or just the title when the text is empty.
- queries: .tsv/.csv (header names id: query_id, qid, id, _id; text: text, query, question,
  title; a table without such a header uses the first column as id and the last as text) or
  .jsonl (same field names).
- qrels: TREC `qid iter docid grade` (whitespace; .trec/.qrels/.qrel, a file named qrels or
  cranqrel, or any unknown extension) or .tsv/.csv `qid docid grade` (header names query_id,
  qid, query-id, topic / doc_id, docid, docno, corpus-id, doc / gain, relevance, grade, label,
  rel, score; a headerless table has 3 columns, or 4 read as TREC). Non-integer grades are
  rounded; a pair judged twice keeps the last grade.
- nDCG@10 as mtrl's metrics.rs (trec_eval): gain = max(grade, 0), discount log2(rank + 1), ideal
  = all judged docs of the query sorted by gain; the mean is over every query in the qrels; a
  query with no relevant doc, or absent from the query file, scores 0. Judged queries are run
  at depth max(10, k): bm25s with the numba backend (docs with score 0, which match no query
  term, are dropped, as an inverted index returns only matches), MiniLM by exact inner product.

Output: one JSON object, on one line on stdout (library chatter goes to stderr), and with --out
also to FILE (indented). Keys (all times are wall clock; "one at a time" = one query per call):
  peer                        "search"
  docs, queries, threads, k   corpus size (after --limit-docs), query count, --threads, --k
  docs_skipped                bad corpus rows skipped (see above; TSV/CSV ragged rows: whole file)
  cpus                        the CPUs the process is pinned to (list of ints)
  device                      "cpu" or "cuda:0" (where MiniLM runs); device_name on cuda
  versions                    {python, torch, sentence_transformers, transformers, tokenizers,
                               bm25s, hnswlib, numpy, scipy, numba, PyStemmer}
  bm25s_numba, bm25s_numpy    {build_docs_per_s: tokenize + index the corpus (after a JIT
                               warm-up on 64 docs), qps_one_at_a_time: best of 2 timed passes
                               after one warm-up pass, tokenize + retrieve top k,
                               p50_ms, p99_ms, mean_ms: per query over the 2 timed passes,
                               query analysis (tokenize, stop words, stem) included}
  minilm_encode_docs          how many docs the encoding figure timed (the first N of the corpus)
  minilm_encode_docs_per_s    docs/s encoding those docs, best of 2 runs, after a 64-doc warm-up
  minilm_encode_runs_s        the 2 run times, seconds
  minilm_batch_size, minilm_max_seq_length   64, 256
  minilm_query_ms             mean ms to embed one query (one at a time, one pass, after 5 warm-up)
  minilm_query_p50_ms, minilm_query_p99_ms   percentiles of the same
  hnswlib_build_s             seconds of add_items for the whole corpus (--threads threads)
  hnswlib_build_vectors_per_s corpus vectors / hnswlib_build_s
  hnswlib                     [{ef_search, recall_at_k, qps}] for ef 16, 32, 64, 128, 256: recall
                               = mean over queries of |HNSW top k ∩ exact inner-product top k| / k,
                               qps = 5 passes one query at a time, 1 thread (search only: the
                               query vectors are embedded beforehand)
  rss_mb                      {baseline: VmRSS after the imports, index_peak: peak RSS of the index
                               stage, serve_peak: peak RSS of the serve stage (both bm25s indexes,
                               the model, the embeddings and the graph are resident)}, MiB
  rss_method                  "clear_refs+VmHWM" (peak reset per stage by writing 5 to
                               /proc/self/clear_refs) or "ru_maxrss" (cannot reset: each peak is
                               the process peak so far, so serve_peak >= index_peak)
  cuda_mem_mb                 (cuda only) {index_peak, serve_peak}: torch.cuda.max_memory_allocated
  stage_s                     {index, serve}: wall seconds of each stage
  loadavg_1m                  {start, index_end, serve_end}: the machine's 1-minute load average;
                               above --threads means something else competed for the cores and the
                               torch figures are not to be trusted (OpenMP spin-waits under
                               contention can make MiniLM 10-20x slower)
  with --qrels:
  bm25s_ndcg_at_10            mean nDCG@10 of bm25s (numba backend)
  minilm_exact_ndcg_at_10     mean nDCG@10 of MiniLM, exact inner-product search
  qrels                       {file, queries: judged queries (the mean's denominator), judgments,
                               without_relevant, missing_from_queries: counts of queries scored 0}
"""
import argparse
import contextlib
import csv
import gc
import gzip
import json
import math
import os
import re
import sys
import time

EF_SWEEP = (16, 32, 64, 128, 256)
BATCH = 64
MAX_SEQ = 256
ID_AUTO = ("id", "doc_id", "_id", "docno")
QUERY_ID_NAMES = ("query_id", "qid", "id", "_id")
QUERY_TEXT_NAMES = ("text", "query", "question", "title")
QREL_QID_NAMES = ("query_id", "qid", "query-id", "topic")
QREL_DOC_NAMES = ("doc_id", "docid", "docno", "corpus-id", "doc")
QREL_GRADE_NAMES = ("gain", "relevance", "grade", "label", "rel", "score")
FLOAT_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.I)


def fail(msg):
    sys.exit(f"search_peers.py: {msg}")


# ---------------------------------------------------------------- readers (as mtrl-search's)

def detect(path):
    """mtrl-search readers::detect: format from the extension, after stripping .gz."""
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = name.rsplit(".", 1)[1] if "." in name else ""
    if ext in ("jsonl", "ndjson"):
        return "jsonl"
    if ext in ("tsv", "tab"):
        return "tsv"
    if ext == "csv":
        return "csv"
    if ext in ("trec", "qrels", "qrel") or name in ("qrels", "cranqrel"):
        return "trec"
    return None


def open_text(path):
    opener = gzip.open if path.lower().endswith(".gz") else open
    return opener(path, "rt", encoding="utf-8", newline="")


def read_table(path, fmt, skip_bad=False):
    """Header (trimmed) and rows as (line, fields); blank lines skipped; a ragged row is an error,
    or with skip_bad dropped (the header and rows come back with the count dropped)."""
    with open_text(path) as f:
        if fmt == "tsv":
            lines = [ln.rstrip("\r\n") for ln in f]
            rows = [(i + 1, ln.split("\t")) for i, ln in enumerate(lines) if ln.strip() != ""]
        else:
            rd = csv.reader(f)
            rows = [(rd.line_num, r) for r in rd if r and not (len(r) == 1 and r[0].strip() == "")]
    if not rows:
        fail(f"{path}: empty")
    header = [h.strip() for h in rows[0][1]]
    good = []
    for n, r in rows[1:]:
        if len(r) == len(header):
            good.append((n, r))
        elif not skip_bad:
            fail(f"{path} line {n}: expected {len(header)} fields like the header, found {len(r)}")
    if skip_bad:
        return header, good, len(rows) - 1 - len(good)
    return header, good


def find_col(header, names):
    low = [h.lower() for h in header]
    for n in names:
        if n in low:
            return low.index(n)
    return None


class BadRow(Exception):
    pass


def json_field(obj, name, required):
    v = obj.get(name)
    if v is None:
        if required:
            raise BadRow(f"missing field `{name}`")
        return ""
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return json.dumps(v)
    raise BadRow(f"field `{name}` must be a string")


def indexed_text(title, text):
    """mtrl Document::indexed_text."""
    title = title.strip()
    if not title or text.lstrip().startswith(title):
        return text
    if not text.strip():
        return title
    return f"{title}\n{text}"


def read_docs(path, limit, id_col):
    """(ids, indexed texts, rows skipped). Like mtrl with skip_bad_rows = true, a bad row
    (malformed, empty id, empty document, repeated id) is skipped and counted: where mtrl
    (skip_bad_rows = false) would stop instead, there is no mtrl figure to compare with anyway."""
    fmt = detect(path)
    if fmt not in ("jsonl", "tsv", "csv"):
        fail(f"{path}: expected .jsonl, .tsv or .csv, optionally .gz")
    raw, skipped = [], 0  # (line, id, title, text)
    if fmt == "jsonl":
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    o = json.loads(line)
                    if not isinstance(o, dict):
                        raise BadRow("expected a JSON object")
                    name = id_col or next((c for c in ID_AUTO if c in o), ID_AUTO[0])
                    raw.append((n, json_field(o, name, True), json_field(o, "title", False),
                                json_field(o, "text", True)))
                except (ValueError, BadRow):
                    raw.append(None)
    else:
        header, rows, skipped = read_table(path, fmt, skip_bad=True)  # ragged rows
        name = id_col or next((c for c in ID_AUTO if c in header), ID_AUTO[0])
        for col in (name, "text"):
            if col not in header:
                fail(f"{path} line 1: header has no `{col}` column (columns: {', '.join(header)})")
        ic, tc = header.index(name), header.index("text")
        hc = header.index("title") if "title" in header else None
        for n, r in rows:
            raw.append((n, r[ic].strip(), r[hc].strip() if hc is not None else "", r[tc].strip()))
    ids, texts, seen = [], [], set()
    for row in raw:
        if row is None:
            skipped += 1
            continue
        n, i, title, text = row
        if not i or (not title.strip() and not text.strip()) or i in seen:
            skipped += 1
            continue
        seen.add(i)
        ids.append(i)
        texts.append(indexed_text(title, text))
        if limit and len(ids) >= limit:
            break
    if not ids:
        fail(f"{path}: no documents")
    return ids, texts, skipped


def read_queries(path):
    """[(id, text)] as mtrl-search queries::load."""
    fmt = detect(path)
    out = []
    if fmt == "jsonl":
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    o = json.loads(line)
                except ValueError as e:
                    fail(f"{path} line {n}: malformed JSON: {e}")

                def pick(names):
                    for k in names:
                        v = o.get(k) if isinstance(o, dict) else None
                        if isinstance(v, str):
                            return v
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            return json.dumps(v)
                    return None
                qid, text = pick(QUERY_ID_NAMES), pick(QUERY_TEXT_NAMES)
                if qid is None or text is None:
                    fail(f"{path} line {n}: no query {'id' if qid is None else 'text'} field")
                out.append((qid, text))
    elif fmt in ("tsv", "csv"):
        header, rows = read_table(path, fmt)
        ic, tc = find_col(header, QUERY_ID_NAMES), find_col(header, QUERY_TEXT_NAMES)
        if ic is None or tc is None:
            if len(header) < 2:
                fail(f"{path} line 1: expected at least two columns: id and text")
            ic, tc = 0, len(header) - 1
            rows = [(1, header)] + rows  # the first line is data (fields are trimmed anyway)
        for n, r in rows:
            qid = r[ic].strip()
            if not qid:
                fail(f"{path} line {n}: empty query id")
            out.append((qid, r[tc].strip()))
    else:
        fail(f"{path}: expected .tsv, .csv or .jsonl")
    if not out:
        fail(f"{path}: empty")
    return out


def parse_grade(s, where):
    s = s.strip()
    if re.fullmatch(r"[+-]?\d+", s):
        return max(-2**31, min(2**31 - 1, int(s)))
    if FLOAT_RE.fullmatch(s):
        f = float(s)
        if math.isnan(f):
            return 0
        if math.isinf(f):
            return 2**31 - 1 if f > 0 else -2**31
        r = int(math.copysign(math.floor(abs(f) + 0.5), f))  # Rust f64::round, `as i32` saturates
        return max(-2**31, min(2**31 - 1, r))
    fail(f"{where}: grade `{s}` is not a number")


def read_qrels(path):
    """{qid: {doc_id: grade}} as mtrl-search Qrels::load."""
    fmt = detect(path) or "trec"
    q = {}
    if fmt == "trec":
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                p = line.split()
                if not p:
                    continue
                if len(p) != 4:
                    fail(f"{path} line {n}: expected 4 fields `qid iter docid grade`, found {len(p)}")
                q.setdefault(p[0], {})[p[2]] = parse_grade(p[3], f"{path} line {n}")
    elif fmt in ("tsv", "csv"):
        header, rows = read_table(path, fmt)
        if FLOAT_RE.fullmatch(header[-1].strip()):
            cols = {3: (0, 1, 2), 4: (0, 2, 3)}.get(len(header))
            if cols is None:
                fail(f"{path} line 1: expected 3 or 4 columns, found {len(header)}")
            rows = [(1, header)] + rows
        else:
            cols = []
            for what, names in (("query id", QREL_QID_NAMES), ("document id", QREL_DOC_NAMES),
                                ("grade", QREL_GRADE_NAMES)):
                c = find_col(header, names)
                if c is None:
                    fail(f"{path} line 1: header has no {what} column (one of {', '.join(names)})")
                cols.append(c)
        qc, dc, gc_ = cols
        for n, r in rows:
            q.setdefault(r[qc].strip(), {})[r[dc].strip()] = parse_grade(r[gc_], f"{path} line {n}")
    else:
        fail(f"{path}: expected TREC qrels or .tsv/.csv")
    if not q:
        fail(f"{path}: empty")
    return q


# ---------------------------------------------------------------- metrics (as mtrl-search's)

def ndcg_at_k(ranked, judged, k):
    seen, dedup = set(), []
    for d in ranked:
        if d not in seen:
            seen.add(d)
            dedup.append(d)
    dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(dedup[:k]))
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mean_ndcg(run, qrels, k=10):
    """metrics::evaluate_run's mean nDCG: over every judged query, 0 when missing from the run."""
    return sum(ndcg_at_k(run[qid], j, k) for qid, j in qrels.items() if qid in run) / len(qrels)


def percentile(sorted_vals, p):
    """mtrl bench_search's percentile: sorted[round((n - 1) * p)]."""
    if not sorted_vals:
        return 0.0
    i = int(math.floor((len(sorted_vals) - 1) * p + 0.5))
    return sorted_vals[min(i, len(sorted_vals) - 1)]


def latency(lat_ms):
    s = sorted(lat_ms)
    return {"p50_ms": percentile(s, 0.50), "p99_ms": percentile(s, 0.99),
            "mean_ms": sum(s) / max(len(s), 1)}


# ---------------------------------------------------------------- memory

def status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Rss:
    def __init__(self):
        self.method = "clear_refs+VmHWM"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if status_kb("VmHWM") is None:
                raise OSError
        except OSError:
            self.method = "ru_maxrss"

    def now_mb(self):
        kb = status_kb("VmRSS")
        if kb is None:
            import resource
            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024

    def reset(self):
        if self.method == "clear_refs+VmHWM":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def peak_mb(self):
        if self.method == "clear_refs+VmHWM":
            return status_kb("VmHWM") / 1024
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---------------------------------------------------------------- main

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", required=True, help="corpus: .jsonl/.tsv/.csv, optionally .gz")
    ap.add_argument("--queries", required=True, help="queries: .tsv/.csv/.jsonl")
    ap.add_argument("--model", required=True, help="sentence-transformers folder of all-MiniLM-L6-v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit-docs", type=int, default=0, help="use only the first N docs (0 = all)")
    ap.add_argument("--encode-docs", type=int, default=0,
                    help="time MiniLM encoding on the first N docs (0 = all)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--qrels", help="judgments: also report nDCG@10 of bm25s and exact MiniLM")
    ap.add_argument("--id-column", help="document id field (default: first of id, doc_id, _id, docno)")
    ap.add_argument("--out", help="also write the JSON object to this file")
    a = ap.parse_args()
    if a.threads < 1 or a.k < 1 or a.limit_docs < 0 or a.encode_docs < 0:
        fail("--threads and --k must be >= 1, --limit-docs and --encode-docs >= 0")
    return a


def pin(threads):
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
              "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        os.environ[v] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cpus)
        return sorted(os.sched_getaffinity(0))
    return None


def versions():
    from importlib import metadata
    out = {"python": sys.version.split()[0]}
    for key, dist in (("torch", "torch"), ("sentence_transformers", "sentence-transformers"),
                      ("transformers", "transformers"), ("tokenizers", "tokenizers"),
                      ("bm25s", "bm25s"), ("hnswlib", "hnswlib"), ("numpy", "numpy"),
                      ("scipy", "scipy"), ("numba", "numba"), ("PyStemmer", "PyStemmer")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "?"
    return out


def run(a, cpus):
    rss = Rss()
    import numpy as np
    import torch
    import bm25s
    import hnswlib
    import Stemmer
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(a.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device")
    cuda = a.device == "cuda"
    baseline = rss.now_mb()
    out = {"peer": "search"}
    load = {"start": os.getloadavg()[0]}
    cuda_mem = {}

    # ------------------------------------------------------------ stage 1: index
    rss.reset()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t_stage = time.perf_counter()
    ids, docs, skipped = read_docs(a.docs, a.limit_docs, a.id_column)
    queries = read_queries(a.queries)
    qtexts = [t for _, t in queries]
    qrels = read_qrels(a.qrels) if a.qrels else None
    k = min(a.k, len(docs))
    out.update({"docs": len(docs), "docs_skipped": skipped, "queries": len(queries), "threads": a.threads, "k": a.k,
                "cpus": cpus, "device": "cuda:0" if cuda else "cpu"})
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(0)
    out["versions"] = versions()

    stem = Stemmer.Stemmer("english")

    def tok(texts):
        return bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)

    bm25 = {}
    for backend in ("numba", "numpy"):
        warm = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend=backend)  # JIT, caches
        warm.index(tok(docs[:64]), show_progress=False)
        warm.retrieve(tok(qtexts[:1]), k=min(k, len(docs[:64])), show_progress=False, n_threads=1)
        del warm
        t = time.perf_counter()
        r = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend=backend)
        r.index(tok(docs), show_progress=False)
        build = time.perf_counter() - t
        bm25[backend] = r
        out[f"bm25s_{backend}"] = {"build_docs_per_s": len(docs) / build}

    model = SentenceTransformer(a.model, device=a.device)
    model.max_seq_length = MAX_SEQ

    def encode(texts):
        return model.encode(texts, batch_size=BATCH, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)

    encode(docs[:BATCH])  # warm-up
    n_enc = len(docs) if a.encode_docs == 0 else min(a.encode_docs, len(docs))
    runs, part = [], None
    for _ in range(2):
        t = time.perf_counter()
        part = encode(docs[:n_enc])
        runs.append(time.perf_counter() - t)
    rest = encode(docs[n_enc:]) if n_enc < len(docs) else np.zeros((0, part.shape[1]), part.dtype)
    emb = np.ascontiguousarray(np.concatenate([part, rest]).astype(np.float32))
    del part, rest
    out.update({"minilm_encode_docs": n_enc, "minilm_encode_docs_per_s": n_enc / min(runs),
                "minilm_encode_runs_s": runs, "minilm_batch_size": BATCH,
                "minilm_max_seq_length": MAX_SEQ})

    idx = hnswlib.Index(space="ip", dim=emb.shape[1])
    idx.init_index(max_elements=len(emb), ef_construction=200, M=16, random_seed=100)
    idx.set_num_threads(a.threads)
    t = time.perf_counter()
    idx.add_items(emb)
    build = time.perf_counter() - t
    out["hnswlib_build_s"] = build
    out["hnswlib_build_vectors_per_s"] = len(emb) / build
    index_s = time.perf_counter() - t_stage
    load["index_end"] = os.getloadavg()[0]
    index_peak = rss.peak_mb()
    if cuda:
        cuda_mem["index_peak"] = torch.cuda.max_memory_allocated() / 2**20

    # ------------------------------------------------------------ stage 2: serve
    gc.collect()
    rss.reset()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t_stage = time.perf_counter()
    bm25_runs = {}
    for backend, r in bm25.items():
        qps, lat = [], []
        for p in range(3):  # the first pass warms numba's JIT and the caches
            t0 = time.perf_counter()
            for q in qtexts:
                t = time.perf_counter()
                r.retrieve(tok([q]), k=k, show_progress=False, n_threads=1)
                if p:
                    lat.append((time.perf_counter() - t) * 1e3)
            qps.append(len(qtexts) / (time.perf_counter() - t0))
        out[f"bm25s_{backend}"].update({"qps_one_at_a_time": max(qps[1:]), **latency(lat)})

    for q in qtexts[:5]:  # warm-up
        encode([q])
    lat, vecs = [], []
    for q in qtexts:
        t = time.perf_counter()
        vecs.append(encode([q])[0])
        lat.append((time.perf_counter() - t) * 1e3)
    qv = np.ascontiguousarray(np.stack(vecs).astype(np.float32))
    ql = latency(lat)
    out.update({"minilm_query_ms": ql["mean_ms"], "minilm_query_p50_ms": ql["p50_ms"],
                "minilm_query_p99_ms": ql["p99_ms"]})

    scores = qv @ emb.T
    exact = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    idx.set_num_threads(1)
    sweep = []
    for ef in EF_SWEEP:
        idx.set_ef(ef)
        labels, _ = idx.knn_query(qv, k=k)
        recall = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(labels.tolist(), exact.tolist())]))
        t = time.perf_counter()
        for _ in range(5):
            for q in qv:
                idx.knn_query(q[None, :], k=k)
        sweep.append({"ef_search": ef, "recall_at_k": recall, "qps": 5 * len(qv) / (time.perf_counter() - t)})
    out["hnswlib"] = sweep

    if qrels is not None:
        depth = min(max(10, a.k), len(docs))
        judged = [(i, qid) for i, (qid, _) in enumerate(queries) if qid in qrels]
        bm_run, mini_run = {}, {}
        top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        for i, qid in judged:  # a repeated query id keeps its last text, as mtrl's HashMap
            res, sc = bm25["numba"].retrieve(tok([qtexts[i]]), k=depth, show_progress=False, n_threads=1)
            bm_run[qid] = [ids[j] for j, s in zip(res[0].tolist(), sc[0].tolist()) if s > 0]
            mini_run[qid] = [ids[j] for j in top[i].tolist()]
        out["bm25s_ndcg_at_10"] = mean_ndcg(bm_run, qrels)
        out["minilm_exact_ndcg_at_10"] = mean_ndcg(mini_run, qrels)
        out["qrels"] = {"file": a.qrels, "queries": len(qrels),
                        "judgments": sum(len(j) for j in qrels.values()),
                        "without_relevant": sum(1 for j in qrels.values() if not any(g > 0 for g in j.values())),
                        "missing_from_queries": sum(1 for qid in qrels if qid not in bm_run)}
    serve_s = time.perf_counter() - t_stage
    out["rss_mb"] = {"baseline": baseline, "index_peak": index_peak, "serve_peak": rss.peak_mb()}
    out["rss_method"] = rss.method
    if cuda:
        cuda_mem["serve_peak"] = torch.cuda.max_memory_allocated() / 2**20
        out["cuda_mem_mb"] = cuda_mem
    out["stage_s"] = {"index": index_s, "serve": serve_s}
    load["serve_end"] = os.getloadavg()[0]
    out["loadavg_1m"] = load
    return out


def main():
    a = parse_args()
    cpus = pin(a.threads)  # before numpy/torch are imported
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
        out = run(a, cpus)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
